//! `lockprobe check-config FILE`: exit 0 on a valid file, 64 with the bad field named.

use std::process::Command;

#[path = "support/pki.rs"]
mod pki;

const GOOD: &str = r#"
listen = "127.0.0.1:9464"
state_file = "/var/lib/lockprobe/state.json"

[[targets]]
name = "orders"
instances = ["https://orders-weu.example.net", "https://orders-neu.example.net"]
api_key_env = "ORDERS_LOCK_API_KEY"
test_prefix = "probe-"
pool_size = 14
locations = ["westeurope", "northeurope"]
cache_ttl = "1h"
replication_bound = "5m"
buffer = "15m"
schedule = "0 0 */6 * * *"
jitter = "5m"
timeout = "60h"
concurrency = 2

[targets.leases]
pre_lock = "48h"
hard_delete = "6h"
write = "5m"
short_write = "30s"
"#;

/// A `[monitor]` table on the Cosmos store, with the key variable [`check`] sets, to
/// append to [`GOOD`].
const MONITOR: &str = "\n[monitor]\nstore = \"cosmos\"\ncosmos_endpoint = \"https://acct.documents.azure.com:443/\"\ncosmos_key_env = \"LOCKPROBE_TEST_CONFIG_COSMOS_KEY\"\ncosmos_database = \"routing\"\ncosmos_container = \"locations\"\n";

fn check(text: &str) -> (Option<i32>, String, String) {
    check_with_env(text, &[])
}

/// [`check`] with more environment variables (a process of its own, so no other test
/// sees them).
fn check_with_env(text: &str, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .arg("check-config")
        .arg(&path)
        // The keys GOOD names: the target's, and the `[monitor]` store's in the tests that
        // add one (base64, never used).
        .env("ORDERS_LOCK_API_KEY", "k")
        .env("LOCKPROBE_TEST_CONFIG_COSMOS_KEY", "cGxhY2Vob2xkZXI=")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn good_config_exits_0() {
    let (code, stdout, stderr) = check(GOOD);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("ok (1 target;"), "{stdout}");
}

/// A pool reused more often within a contract-1.3 service's key window than it keeps
/// records for gets a note with the arithmetic (its lock calls would be refused 429);
/// the documented 6-hourly schedule does not, nor does a 1-minute one with a pool large
/// enough.
#[test]
fn a_pool_reused_past_the_services_key_records_is_noted() {
    let (code, stdout, stderr) = check(GOOD);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("idempotency-records-full"), "{stdout}");
    let every_minute = GOOD.replace(r#"schedule = "0 0 */6 * * *""#, r#"schedule = "0 * * * * *""#);
    assert_ne!(every_minute, GOOD);
    let (code, stdout, stderr) = check(&every_minute);
    assert_eq!(code, Some(0), "a note, not a refusal: {stdout}{stderr}");
    assert!(
        stdout.contains("schedule and pool_size: each group of 7 resources is used about 1440 times in 48 h")
            && stdout.contains("expect 429 idempotency-records-full; use at most 51 times a group"),
        "{stdout}"
    );
    let (code, stdout, stderr) = check(&every_minute.replace("pool_size = 14", "pool_size = 399"));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("idempotency-records-full"), "57 groups at 1-minute: {stdout}");
}

/// The state file's place: a directory missing on the checking host is a note (the
/// configuration may be for another host); one that exists and cannot take the file's
/// writes is refused, naming `state_file`.
#[test]
fn the_state_file_place_is_checked_where_it_exists() {
    let (code, stdout, stderr) = check(&GOOD.replace("/var/lib/lockprobe/", "/nonexistent/lockprobe/"));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("note: state_file: the directory /nonexistent/lockprobe does not exist"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::create_dir(dir.path().join("state.json.tmp")).unwrap();
    let (code, stdout, stderr) = check(&GOOD.replace("/var/lib/lockprobe/state.json", state.to_str().unwrap()));
    assert_eq!(code, Some(64), "{stdout}{stderr}");
    assert!(stderr.contains("state_file: cannot be written"), "{stderr}");
}

#[test]
fn bad_fields_exit_64_naming_the_field() {
    for (from, to, field) in [
        ("schedule = \"0 0 */6 * * *\"", "schedule = \"six-hourly\"", "targets[0].schedule"),
        ("concurrency = 2", "concurrency = 0", "targets[0].concurrency"),
        ("pool_size = 14", "pool_size = 13", "targets[0].pool_size"),
        ("buffer = \"15m\"", "buffer = \"a while\"", "buffer"),
        ("jitter = \"5m\"", "jitter = \"5m\"\njiter = \"1m\"", "jiter"),
        ("short_write = \"30s\"", "short_write = \"10m\"", "targets[0].leases.short_write"),
        ("listen = \"127.0.0.1:9464\"", "listen = \"localhost\"", "listen"),
        ("concurrency = 2", "concurrency = 2\nmax_inconclusive = 1.5", "targets[0].max_inconclusive"),
        ("concurrency = 2", "concurrency = 2\nmax_inconclusive = -0.1", "targets[0].max_inconclusive"),
    ] {
        let (code, stdout, stderr) = check(&GOOD.replace(from, to));
        assert_eq!(code, Some(64), "{to}: {stdout}{stderr}");
        assert!(stderr.contains(field), "{to}: expected {field} in {stderr}");
    }
}

/// A field's line in GOOD to replace, its key, the field as a refusal names it, and values
/// with whether each is taken.
type BoundsCase = (&'static str, &'static str, &'static str, Vec<(String, bool)>);

/// Every number of the configuration `serve` reads has a floor and a ceiling (issue 29):
/// each field at its minimum and at its maximum is taken, and a value past either, or
/// absurd (a pool of four billion resources aborted `serve` on allocation), is refused
/// with exit 64 naming the field. Durations are bounded at ten years by their parser.
#[test]
fn every_number_is_taken_at_its_bounds_and_refused_past_them() {
    // (the line in GOOD to replace, the field as refused, [(value, taken)])
    let pool = |v: &str| format!("pool_size = {v}");
    let cases: Vec<BoundsCase> = vec![
        (
            "pool_size = 14",
            "pool_size",
            "targets[0].pool_size",
            vec![
                (pool("14"), true),
                (pool("10000"), true),
                (pool("10001"), false),
                (pool("4000000000"), false),
                (pool("-1"), false),
            ],
        ),
        (
            "concurrency = 2",
            "concurrency",
            "targets[0].concurrency",
            vec![
                ("concurrency = 1".into(), true),
                ("concurrency = 1000".into(), true),
                ("concurrency = 1001".into(), false),
                ("concurrency = 0".into(), false),
                ("concurrency = 18446744073709551615".into(), false),
            ],
        ),
        (
            "concurrency = 2",
            "concurrent_pre_locks",
            "targets[0].concurrent_pre_locks",
            vec![
                (
                    "concurrency = 2
concurrent_pre_locks = 2"
                        .into(),
                    true,
                ),
                (
                    "concurrency = 2
concurrent_pre_locks = 64"
                        .into(),
                    true,
                ),
                (
                    "concurrency = 2
concurrent_pre_locks = 1"
                        .into(),
                    false,
                ),
                (
                    "concurrency = 2
concurrent_pre_locks = 65"
                        .into(),
                    false,
                ),
                (
                    "concurrency = 2
concurrent_pre_locks = 4000000000"
                        .into(),
                    false,
                ),
            ],
        ),
        (
            "concurrency = 2",
            "max_inconclusive",
            "targets[0].max_inconclusive",
            vec![
                (
                    "concurrency = 2
max_inconclusive = 0"
                        .into(),
                    true,
                ),
                (
                    "concurrency = 2
max_inconclusive = 1"
                        .into(),
                    true,
                ),
                (
                    "concurrency = 2
max_inconclusive = 1e308"
                        .into(),
                    false,
                ),
                (
                    "concurrency = 2
max_inconclusive = nan"
                        .into(),
                    false,
                ),
            ],
        ),
        (
            "listen = \"127.0.0.1:9464\"",
            "max_concurrent_cycles",
            "max_concurrent_cycles",
            vec![
                ("listen = \"127.0.0.1:9464\"\nmax_concurrent_cycles = 1".into(), true),
                ("listen = \"127.0.0.1:9464\"\nmax_concurrent_cycles = 100000".into(), true),
                ("listen = \"127.0.0.1:9464\"\nmax_concurrent_cycles = 100001".into(), false),
                ("listen = \"127.0.0.1:9464\"\nmax_concurrent_cycles = 0".into(), false),
            ],
        ),
        (
            "timeout = \"60h\"",
            "timeout",
            "timeout",
            vec![("timeout = \"3650days\"".into(), true), ("timeout = \"500000years\"".into(), false)],
        ),
    ];
    for (line, name, field, values) in cases {
        for (value, taken) in values {
            let mut text = GOOD.replace(line, &value);
            // A concurrency of 1,000 needs a pool of 7,000 (seven resources a cycle).
            if value.contains("concurrency = 1000") {
                text = text.replace("pool_size = 14", "pool_size = 7000");
            }
            let (code, stdout, stderr) = check(&text);
            if taken {
                assert_eq!(code, Some(0), "{name}: {value} must be taken: {stdout}{stderr}");
            } else {
                assert_eq!(code, Some(64), "{name}: {value} must be refused: {stdout}{stderr}");
                // Past the type's range the TOML parser refuses it, quoting the line (the
                // key, not the target's index); past the checks, the field in full.
                let parsed = !stderr.contains("TOML parse error");
                assert!(
                    stderr.contains(if parsed { field } else { name }),
                    "{name}: {value}: expected {field} in {stderr}"
                );
            }
        }
    }
    // `[monitor]`: its pages, as keys of the serve configuration.
    for key in ["monitor_poll_batch", "monitor_scan_page"] {
        for (value, taken) in [("1", true), ("100000", true), ("100001", false), ("0", false)] {
            let text = format!("{GOOD}{MONITOR}{key} = {value}\n");
            let (code, stdout, stderr) = check(&text);
            if taken {
                assert_eq!(code, Some(0), "{key} = {value} must be taken: {stdout}{stderr}");
            } else {
                assert_eq!(code, Some(64), "{key} = {value} must be refused: {stdout}{stderr}");
                assert!(stderr.contains(key), "{key} = {value}: {stderr}");
            }
        }
    }
}

/// A `[monitor]` key in the file wins over its flag's environment variable, which
/// fills only the keys the file leaves out; a `false` switch in the file wins too.
#[test]
fn a_monitor_key_in_the_file_wins_over_its_variable() {
    let bad_page = [("LOCKPROBE_MONITOR_SCAN_PAGE", "0")];
    let (code, stdout, stderr) = check_with_env(&format!("{GOOD}{MONITOR}"), &bad_page);
    assert_eq!(code, Some(64), "the variable fills a key the file leaves out: {stdout}{stderr}");
    assert!(
        stderr.contains(
            "monitor_scan_page: must be at least 1 (from the environment variable LOCKPROBE_MONITOR_SCAN_PAGE: the file sets no monitor_scan_page)"
        ),
        "{stderr}"
    );
    let (code, stdout, stderr) = check_with_env(&format!("{GOOD}{MONITOR}monitor_scan_page = 10\n"), &bad_page);
    assert_eq!(code, Some(0), "the file's key wins: {stdout}{stderr}");
    let bad_switch = [("LOCKPROBE_COSMOS_CREATE_IF_MISSING", "perhaps")];
    let (code, stdout, stderr) = check_with_env(&format!("{GOOD}{MONITOR}"), &bad_switch);
    assert_eq!(code, Some(64), "the variable is read when the file has no key: {stdout}{stderr}");
    assert!(
        stderr.contains("cosmos_create_if_missing")
            && stderr.contains("from the environment variable LOCKPROBE_COSMOS_CREATE_IF_MISSING"),
        "the refusal names the variable the value came from: {stderr}"
    );
    let (code, stdout, stderr) =
        check_with_env(&format!("{GOOD}{MONITOR}cosmos_create_if_missing = false\n"), &bad_switch);
    assert_eq!(code, Some(0), "a false switch in the file wins: {stdout}{stderr}");
}

/// `serve` refuses the absurd pool at once, instead of aborting on a 96 GB allocation.
#[test]
fn serve_refuses_an_absurd_pool_instead_of_aborting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.toml");
    let text = GOOD
        .replace("pool_size = 14", "pool_size = 4000000000")
        .replace("/var/lib/lockprobe/state.json", dir.path().join("state.json").to_str().unwrap());
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env("ORDERS_LOCK_API_KEY", "k")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("targets[0].pool_size") && stderr.contains("at most 10000"), "{stderr}");
}

/// `check-config` runs what `serve` runs at start: a target's key variable that is not
/// set is refused here as there, naming the variable (it used to pass here and stop
/// `serve`), and the answer says what was checked.
#[test]
fn an_unset_key_variable_is_refused_as_serve_refuses_it() {
    let (code, stdout, _) = check(GOOD);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("checked: every field, each target's lock API key"), "{stdout}");
    let (code, stdout, stderr) = check(&GOOD.replace("ORDERS_LOCK_API_KEY", "ORDERS_KEY_NOBODY_SET"));
    assert_eq!(code, Some(64), "{stdout}{stderr}");
    assert!(stderr.contains("ORDERS_KEY_NOBODY_SET"), "{stderr}");
}

#[test]
fn missing_file_exits_64() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["check-config", "/nonexistent/probe.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/probe.toml"));
}

/// A 2s wait before escalating (cache TTL 1s + replication bound 500ms + buffer 500ms)
/// and a 3s timeout: the main walk alone waits that long, and the negative checks wait
/// it again, so every cycle would be cancelled. check-config says so, with the sums.
#[test]
fn a_timeout_below_the_worst_case_cycle_exits_64_with_the_arithmetic() {
    let short = GOOD
        .replace("cache_ttl = \"1h\"", "cache_ttl = \"1s\"")
        .replace("replication_bound = \"5m\"", "replication_bound = \"500ms\"")
        .replace("buffer = \"15m\"", "buffer = \"500ms\"")
        .replace("timeout = \"60h\"", "timeout = \"3s\"");
    let (code, stdout, stderr) = check(&short);
    assert_eq!(code, Some(64), "{stdout}{stderr}");
    assert!(stderr.contains("targets[0].timeout"), "{stderr}");
    assert!(stderr.contains("worst-case cycle of") && stderr.contains("wait before escalating 2s"), "{stderr}");
    let (code, stdout, stderr) = check(&short.replace("timeout = \"3s\"", "timeout = \"2m\""));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

/// GOOD with its key from `key_file` instead of a variable, and `tls` (TOML lines) added
/// to the target.
fn with_files(key_file: &std::path::Path, tls: &str) -> String {
    GOOD.replace(
        "api_key_env = \"ORDERS_LOCK_API_KEY\"",
        &format!("api_key_file = {:?}\n{tls}", key_file.display().to_string()),
    )
}

#[test]
fn key_and_tls_files_are_read_and_checked_when_the_config_is_loaded() {
    let pki = pki::Pki::generate();
    let key = pki.write("orders-key", "the-key\n");
    let toml_path = |p: &std::path::Path| format!("{:?}", p.display().to_string());
    let tls = format!(
        "ca_file = {}\nclient_cert_file = {}\nclient_key_file = {}",
        toml_path(&pki.server_ca),
        toml_path(&pki.client_cert),
        toml_path(&pki.client_key)
    );
    let (code, stdout, stderr) = check(&with_files(&key, &tls));
    assert_eq!(code, Some(0), "{stdout}{stderr}");

    let empty = pki.write("empty-key", "\n");
    let missing = pki.dir.join("missing");
    let garbage = pki.write("garbage.pem", "-----BEGIN CERTIFICATE-----\n%%%\n-----END CERTIFICATE-----\n");
    let only_ca = format!("ca_file = {}", toml_path(&pki.server_ca));
    for (text, field, path) in [
        (with_files(&empty, ""), "targets[0].api_key_file", &empty),
        (with_files(&missing, ""), "targets[0].api_key_file", &missing),
        (
            GOOD.replace("test_prefix", &format!("api_key_file = {}\ntest_prefix", toml_path(&key))),
            "targets[0].api_key_file",
            &key,
        ),
        (with_files(&key, &format!("ca_file = {}", toml_path(&missing))), "targets[0].ca_file", &missing),
        (with_files(&key, &format!("ca_file = {}", toml_path(&garbage))), "targets[0].ca_file", &garbage),
        (with_files(&key, &format!("ca_file = {}", toml_path(&pki.client_key))), "targets[0].ca_file", &pki.client_key),
        (
            with_files(&key, &format!("{only_ca}\nclient_cert_file = {}", toml_path(&pki.client_cert))),
            "targets[0].client_key_file",
            &pki.client_cert,
        ),
        (
            with_files(&key, &format!("{only_ca}\nclient_key_file = {}", toml_path(&pki.client_key))),
            "targets[0].client_cert_file",
            &pki.client_key,
        ),
        (
            with_files(
                &key,
                &format!(
                    "client_cert_file = {}\nclient_key_file = {}",
                    toml_path(&pki.client_cert),
                    toml_path(&pki.stranger_key)
                ),
            ),
            "targets[0].client_key_file",
            &pki.stranger_key,
        ),
    ] {
        let (code, stdout, stderr) = check(&text);
        assert_eq!(code, Some(64), "{field}: {stdout}{stderr}");
        assert!(stderr.contains(field), "expected {field} in {stderr}");
        // Both-given names the field but has no path to show.
        if field != "targets[0].api_key_file" || path != &key {
            assert!(stderr.contains(&path.display().to_string()), "expected {} in {stderr}", path.display());
        }
        assert!(!stderr.contains("the-key"), "the key is never printed: {stderr}");
    }
}
