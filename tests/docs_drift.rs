//! Docs that cannot drift: what README.md, docs/, the alert rules, the dashboards and the
//! deploy files name is checked against what ships, and a stale reference fails with its
//! file and line.
//!
//! - **Metrics** against a real `/metrics` of `lockprobe demo` after a cycle (the probe's
//!   and the monitor's series); the few that only exist under other conditions (a Cosmos
//!   store, `serve`'s reloads, a violation) are listed with the condition and must at
//!   least be registered by the source.
//! - **Paths** (`src/...`, `tests/...`, `alerts/...`, and the like, in backticks or as
//!   relative links) against the tree.
//! - **Flags** of every `lockprobe <command> --flag` against that command's `--help`.
//! - **Alert conditions**: each runbook section states its rule's expression and `for:`
//!   as the rule files have them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file the docs check reads: README.md and docs/*.md (prose), the rules, the
/// dashboards and the deploy tree (metric names).
fn files(exts: &[&str], roots: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, exts, out);
            } else if exts.iter().any(|x| p.extension().is_some_and(|e| e == *x)) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let p = repo().join(root);
        if p.is_file() {
            out.push(p);
        } else {
            walk(&p, exts, &mut out);
        }
    }
    out.sort();
    out
}

fn prose() -> Vec<PathBuf> {
    files(&["md"], &["README.md", "docs"])
}

/// `(file:line, token)` for every token of `text` that `pick` accepts, split on what
/// cannot be part of a name.
fn tokens(file: &Path, pick: impl Fn(&str) -> bool, split: impl Fn(char) -> bool) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(file).expect("read");
    let rel = file.strip_prefix(repo()).unwrap_or(file).display().to_string();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for t in line.split(&split) {
            if pick(t) {
                out.push((format!("{rel}:{}", n + 1), t.to_owned()));
            }
        }
    }
    out
}

/// Series names as exposed: a histogram's `_bucket`, `_sum` and `_count` are its name.
fn base_name(name: &str) -> &str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(b) = name.strip_suffix(suffix) {
            return b;
        }
    }
    name
}

/// Metrics a demo does not export, with when they are: each must still be registered.
const CONDITIONAL: &[(&str, &str)] = &[
    ("lockprobe_cosmos_failovers_total", "a Cosmos DB store"),
    ("lockprobe_cosmos_request_charge_total", "a Cosmos DB store"),
    ("lockprobe_cosmos_request_duration_seconds", "a Cosmos DB store"),
    ("lockprobe_cosmos_requests_total", "a Cosmos DB store"),
    ("lockprobe_cosmos_write_region", "a Cosmos DB store"),
    ("lockprobe_cosmos_write_region_mismatch", "a Cosmos DB store"),
    ("lockprobe_cosmos_write_region_refreshes_total", "a Cosmos DB store"),
    ("lockprobe_config_last_reload_success_timestamp_seconds", "`serve` (reloads its config file)"),
    ("lockprobe_config_last_reload_successful", "`serve` (reloads its config file)"),
    ("lockprobe_enforcement_violations_total", "a cycle that found a violation"),
    ("lockprobe_enforcement_violation_unresolved", "a cycle that found a violation"),
    ("lockprobe_store_document_calls_total", "`lockprobe bench` (the counting store)"),
    ("lockprobe_web_config_last_reload_success_timestamp_seconds", "`--web.config.file`"),
    ("lockprobe_web_config_last_reload_successful", "`--web.config.file`"),
];

/// What a demo serves after its first finished cycle: `/metrics`, `/api/v1/status` and
/// `/api/v1/monitor`. Run once for every test that reads it.
struct DemoScrape {
    metrics: String,
    status: serde_json::Value,
    monitor: serde_json::Value,
}

fn demo() -> &'static DemoScrape {
    static DEMO: std::sync::OnceLock<DemoScrape> = std::sync::OnceLock::new();
    DEMO.get_or_init(demo_scrape)
}

fn demo_scrape() -> DemoScrape {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["demo", "--cycles", "2", "--schedule", "*/2 * * * * *", "--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Lines on a thread of their own, so a demo that goes quiet fails the test at the
    // deadline instead of hanging it.
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    loop {
        let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            let _ = child.kill();
            panic!("no cycle finished within 120 s:\n{}", seen.join("\n"));
        };
        let done = line.starts_with("[demo] cycle: passed") || line.starts_with("[demo] cycle: failed");
        seen.push(line);
        if done {
            break;
        }
    }
    let base = format!("http://127.0.0.1:{port}");
    let scrape = tokio::runtime::Runtime::new().unwrap().block_on(async {
        // The monitor's sweep and the cycle's own series land within a second or two.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let get = |path: &str| reqwest::get(format!("{base}{path}"));
        DemoScrape {
            metrics: get("/metrics").await.expect("scrape").text().await.unwrap(),
            status: get("/api/v1/status").await.expect("status").json().await.unwrap(),
            monitor: get("/api/v1/monitor").await.expect("monitor").json().await.unwrap(),
        }
    });
    let _ = child.kill();
    let _ = child.wait();
    scrape
}

/// Every key of a JSON value, at any depth.
fn keys_of(value: &serde_json::Value, into: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                into.insert(k.clone());
                keys_of(v, into);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| keys_of(v, into)),
        _ => {}
    }
}

fn registered_in_source(name: &str) -> bool {
    files(&["rs"], &["src"])
        .iter()
        .any(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains(&format!("\"{name}\""))))
}

/// A `camelCase` field the docs name beside `/api/v1/status` or `/api/v1/monitor` (in
/// the same paragraph) is one the demo serves there, or a stored document's (the
/// compatibility corpus); a `snake_case` one must not be a served field misspelt (the
/// runbook once said `recent_anomalies` where the API says `recentAnomalies`).
#[test]
fn every_json_field_the_docs_name_is_served() {
    let scrape = demo();
    let mut known = BTreeSet::new();
    keys_of(&scrape.status, &mut known);
    keys_of(&scrape.monitor, &mut known);
    assert!(known.contains("targets") && known.contains("recentAnomalies"), "not the demo's status: {known:?}");
    for corpus in files(&["json"], &["tests/compat"]) {
        let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(corpus).unwrap()).unwrap();
        keys_of(&stored, &mut known);
    }
    let camel_of = |t: &str| {
        let mut words = t.split('_');
        let first = words.next().unwrap_or_default().to_owned();
        words.fold(first, |acc, w| acc + &w[..1].to_uppercase() + &w[1..])
    };
    let field_like = |t: &str| {
        t.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && (t.chars().any(|c| c.is_ascii_uppercase()) || t.contains('_'))
            && !t.ends_with('_')
            && !t.contains("__")
    };
    let mut checked = 0;
    let mut stale = Vec::new();
    for file in prose() {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut line_no = 1;
        for paragraph in text.split("\n\n") {
            let about_the_api = paragraph.contains("/api/v1/status") || paragraph.contains("/api/v1/monitor");
            for (n, line) in paragraph.lines().enumerate() {
                // Metric names and flags are checked by their own tests.
                let fields =
                    line.split('`').skip(1).step_by(2).filter(|t| field_like(t) && !t.starts_with("lockprobe_"));
                for field in fields.filter(|_| about_the_api) {
                    checked += 1;
                    let misspelt = field.contains('_') && known.contains(&camel_of(field));
                    let unknown = !field.contains('_') && !known.contains(field);
                    if misspelt || unknown {
                        let rel = file.strip_prefix(repo()).unwrap().display();
                        stale.push(format!("{rel}:{}: `{field}`", line_no + n));
                    }
                }
            }
            line_no += paragraph.lines().count() + 1;
        }
    }
    assert!(checked >= 10, "only {checked} fields found in the docs: the scan is broken");
    assert!(stale.is_empty(), "fields the docs name that nothing serves:\n{}", stale.join("\n"));
}

#[test]
fn every_metric_the_docs_name_is_exported() {
    let scrape = &demo().metrics;
    let exported: BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(base_name)
        .collect();
    assert!(exported.contains("lockprobe_probe_runs_total"), "not a lockprobe scrape:\n{scrape}");
    let conditional: BTreeMap<&str, &str> = CONDITIONAL.iter().copied().collect();
    for (name, _) in CONDITIONAL {
        assert!(registered_in_source(name), "CONDITIONAL lists {name}, which no source file registers");
    }
    let mut stale = Vec::new();
    let sources =
        files(&["md", "yml", "yaml", "json", "toml"], &["README.md", "docs", "alerts", "dashboards", "deploy"]);
    for file in &sources {
        let is_name_char = |c: char| !(c.is_ascii_alphanumeric() || c == '_');
        for (at, t) in tokens(file, |t| t.starts_with("lockprobe_") && !t.ends_with('_'), is_name_char) {
            let name = base_name(&t);
            if !exported.contains(name) && !conditional.contains_key(name) {
                stale.push(format!("{at}: {t}"));
            }
        }
    }
    assert!(stale.is_empty(), "metrics named but not exported:\n{}", stale.join("\n"));
}

#[test]
fn every_path_the_docs_name_exists() {
    const ROOTS: [&str; 11] = [
        "src/",
        "tests/",
        "docs/",
        "alerts/",
        "dashboards/",
        "deploy/",
        "scripts/",
        "examples/",
        "benches/",
        ".ci/",
        ".github/",
    ];
    let mut stale = Vec::new();
    for file in prose() {
        let dir = file.parent().unwrap().to_owned();
        let split = |c: char| matches!(c, '`' | '(' | ')' | '[' | ']' | ' ' | ',' | ';');
        let pick = |t: &str| ROOTS.iter().any(|r| t.starts_with(r) || t.starts_with(&format!("../{r}")));
        for (at, t) in tokens(&file, pick, split) {
            // Globs and placeholders name families, not files.
            if t.contains(['*', '<', '{', '$']) || t.contains("NNN") {
                continue;
            }
            let t = t.split('#').next().unwrap().trim_end_matches(['.', ':', '"', '\'']);
            let found = repo().join(t.trim_start_matches("../")).exists() || dir.join(t).exists();
            if !found {
                stale.push(format!("{at}: {t}"));
            }
        }
    }
    assert!(stale.is_empty(), "paths named but not in the tree:\n{}", stale.join("\n"));
}

#[test]
fn every_flag_the_docs_name_is_a_flag_of_its_command() {
    let commands = ["service", "demo", "validate", "gate", "serve", "monitor", "bench", "check-config"];
    let help: BTreeMap<&str, String> = commands
        .iter()
        .map(|c| {
            let out = Command::new(env!("CARGO_BIN_EXE_lockprobe")).args([c, "--help"]).output().unwrap();
            (*c, String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .collect();
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in prose() {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(repo()).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            // Each `lockprobe <command>` up to the end of its code span or line.
            let mut rest = line;
            while let Some(i) = rest.find("lockprobe ") {
                rest = &rest[i + "lockprobe ".len()..];
                let end = rest.find('`').unwrap_or(rest.len());
                let call = &rest[..end];
                let Some(command) = commands.iter().find(|c| call.split_whitespace().next() == Some(**c)) else {
                    continue;
                };
                // Up to a pipe, another command or `--` (the gate passes what follows to
                // its candidate service): what follows belongs to someone else.
                let call = call.split(['|', ';']).next().unwrap_or_default();
                let call = call.split(" -- ").next().unwrap_or_default();
                for flag in call.split_whitespace().filter(|w| w.starts_with("--") && w.len() > 2) {
                    let flag = flag.split('=').next().unwrap().trim_end_matches([',', '.', ')', ':']);
                    if !flag[2..].chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
                        continue;
                    }
                    checked += 1;
                    if !help[command].contains(&format!("{flag} ")) && !help[command].contains(&format!("{flag}\n")) {
                        stale.push(format!("{rel}:{}: lockprobe {command} {flag}", n + 1));
                    }
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} flags found in the docs: the scan is broken");
    assert!(stale.is_empty(), "flags named but not in the command's --help:\n{}", stale.join("\n"));
}

/// `(alert, expression with whitespace collapsed, its `for:`)` of every rule of `file`:
/// the files are ours, one rule per `- alert:`, `expr:` inline or a `|` block.
fn rules(file: &str) -> Vec<(String, String, Option<String>)> {
    let text = std::fs::read_to_string(repo().join(file)).expect(file);
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim().strip_prefix("- alert:") else { continue };
        let rule_indent = indent(line) + 2;
        let body: Vec<&str> =
            lines[i + 1..].iter().take_while(|l| l.trim().is_empty() || indent(l) >= rule_indent).copied().collect();
        let mut expr = String::new();
        let mut held = None;
        for (j, l) in body.iter().enumerate() {
            if indent(l) != rule_indent {
                continue;
            }
            if let Some(v) = l.trim().strip_prefix("expr:") {
                if v.trim() == "|" {
                    let block = body[j + 1..].iter().take_while(|b| b.trim().is_empty() || indent(b) > rule_indent);
                    expr = block.map(|b| b.trim()).collect::<Vec<_>>().join(" ");
                } else {
                    expr = v.trim().to_owned();
                }
            }
            if let Some(v) = l.trim().strip_prefix("for:") {
                held = Some(v.trim().to_owned());
            }
        }
        out.push((name.trim().to_owned(), expr.split_whitespace().collect::<Vec<_>>().join(" "), held));
    }
    out
}

/// The runbook states each alert's condition as the rule file has it: its expression
/// (thresholds and windows included) and how long it must hold, in the alert's section.
#[test]
fn every_runbook_section_states_its_rules_condition() {
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    let mut wrong = Vec::new();
    let all: Vec<_> =
        ["alerts/lockprobe.rules.yml", "alerts/lockprobe-monitor.rules.yml"].iter().flat_map(|f| rules(f)).collect();
    assert!(all.len() > 20, "only {} rules parsed", all.len());
    for (alert, expr, held) in all {
        let Some(start) = runbook.find(&format!("### {alert} (")) else {
            wrong.push(format!("{alert}: no section"));
            continue;
        };
        let section = &runbook[start..];
        let section = &section[..section[4..].find("\n### ").map_or(section.len(), |e| e + 4)];
        let want = format!(
            "**Condition** (from the rule, {}): `{expr}`",
            held.as_deref().map_or("at once".to_owned(), |h| format!("held for {h}"))
        );
        let stated: String = section.split_whitespace().collect::<Vec<_>>().join(" ");
        if !stated.contains(&want) {
            wrong.push(format!("{alert}: the runbook should say\n  {want}"));
        }
    }
    assert!(wrong.is_empty(), "runbook sections out of step with the rules:\n{}", wrong.join("\n"));
}
