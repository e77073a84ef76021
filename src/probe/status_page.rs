//! The human status page served at `/`: the `/api/v1/status` document rendered as one
//! self-contained HTML page (inline CSS, no scripts), so an on-call engineer can read it in
//! any browser, including a text one, with nothing else deployed.
//!
//! The renderer is a pure function of the status document ([`StatusDocument`], the type
//! `GET /api/v1/status` serves): "ago" times are relative to its `generatedAt`, not to a
//! clock, and an absent value renders as "—". Every free-text string is HTML-escaped:
//! target names, resources, outcomes and assertion details come from configuration and
//! from the target's responses, which the probe does not trust.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};

use super::metrics::PercentilesDocument;
use super::report::CycleResult;
use super::status::{AssertionDocument, ConvergenceDocument, CycleDocument, StatusDocument, TargetDocument};
use super::vocabulary::Phase;
use crate::percentiles::Summary;

/// Seconds between automatic reloads (a meta refresh: the page stays script-free).
const REFRESH_SECONDS: u32 = 15;

/// Renders the status document (the body of `GET /api/v1/status`) as a complete HTML page.
pub fn render(status: &StatusDocument) -> String {
    let mut page = String::with_capacity(16 * 1024);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(page, "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">");
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str("<title>lockprobe status</title>\n<style>\n");
    page.push_str(CSS);
    page.push_str("</style>\n</head>\n<body>\n<header>\n<h1>lockprobe</h1>\n");
    let (ready_class, ready_text) = if status.ready { ("ok", "ready") } else { ("bad", "not ready") };
    let _ = writeln!(
        page,
        "<p class=\"meta\"><span class=\"badge {ready_class}\">{ready_text}</span> \
         generated <time>{}</time></p>\n</header>\n<main>",
        time(status.generated_at)
    );
    if status.targets.is_empty() {
        page.push_str("<p class=\"empty\">No targets configured.</p>\n");
    }
    for target in &status.targets {
        render_target(&mut page, target, status.generated_at);
    }
    page.push_str("</main>\n</body>\n</html>\n");
    page
}

fn render_target(page: &mut String, target: &TargetDocument, now: DateTime<Utc>) {
    let name = &target.name;
    let _ = writeln!(page, "<section class=\"target\" id=\"target-{}\">\n<h2>{}</h2>", esc(&anchor(name)), esc(name));

    // Summary: instances, last success, missed schedules.
    page.push_str("<dl class=\"summary\">\n");
    let instances: Vec<String> = target.instances.iter().map(|i| esc(i)).collect();
    let _ = writeln!(
        page,
        "<dt>Instances</dt><dd>{}</dd>",
        if instances.is_empty() { "—".to_string() } else { instances.join(", ") }
    );
    let last_success = match target.last_success_at {
        None => "<span class=\"bad\">never</span>".to_string(),
        Some(at) => {
            format!("<time>{}</time>{}", time(at), ago(now, at).map(|a| format!(" ({a} ago)")).unwrap_or_default())
        }
    };
    let _ = writeln!(page, "<dt>Last success</dt><dd>{last_success}</dd>");
    let missed_class = if target.missed_schedules > 0 { " class=\"warn\"" } else { "" };
    let _ = writeln!(page, "<dt>Missed schedules</dt><dd{missed_class}>{}</dd>\n</dl>", target.missed_schedules);

    render_convergence(page, &target.convergence);
    render_percentiles(page, &target.percentiles);
    render_cycles(page, &target.last_cycles);
    page.push_str("</section>\n");
}

/// Declared against observed convergence; observed above declared is the unsafe case (the
/// orchestrator would escalate before caches converged), so it is flagged.
fn render_convergence(page: &mut String, conv: &ConvergenceDocument) {
    let (declared, observed) = (conv.declared_seconds, conv.observed_seconds);
    let unsafe_ = matches!((observed, declared), (Some(o), Some(d)) if o > d);
    page.push_str("<h3>Convergence</h3>\n<table class=\"conv\">\n");
    page.push_str("<tr><th>declared</th><th>expected</th><th>observed</th></tr>\n");
    let _ = writeln!(
        page,
        "<tr><td>{}</td><td>{}</td><td{}>{}{}</td></tr>\n</table>",
        seconds(declared),
        seconds(conv.expected_seconds),
        if unsafe_ { " class=\"fail\"" } else { "" },
        seconds(observed),
        if unsafe_ { " — above declared" } else { "" }
    );
}

fn render_percentiles(page: &mut String, pct: &PercentilesDocument) {
    page.push_str("<h3>Percentiles</h3>\n<table class=\"pct\">\n");
    page.push_str("<tr><th>measure</th><th>count</th><th>p50</th><th>p75</th><th>p99</th><th>max</th></tr>\n");
    let phases = &pct.lock_phase_duration_seconds;
    let mut rows: Vec<(String, &Summary)> = vec![
        (format!("{} hold", Phase::PreLock), &phases.pre_lock),
        (format!("{} hold", Phase::HardDelete), &phases.hard_delete),
        (format!("{} hold", Phase::Write), &phases.write),
    ];
    rows.push(("read-through latency".into(), &pct.read_through_latency_seconds));
    rows.push(("observed convergence".into(), &pct.observed_convergence_seconds));
    for (label, s) in rows {
        let _ = writeln!(
            page,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&label),
            s.count,
            seconds(s.p50),
            seconds(s.p75),
            seconds(s.p99),
            seconds(s.max)
        );
    }
    page.push_str("</table>\n");
}

fn render_cycles(page: &mut String, cycles: &[CycleDocument]) {
    page.push_str("<h3>Last cycles</h3>\n");
    if cycles.is_empty() {
        page.push_str("<p class=\"empty\">No cycles yet.</p>\n");
        return;
    }
    for cycle in cycles {
        let class = result_class(cycle.result);
        let duration = seconds(Some((cycle.finished_at - cycle.started_at).num_milliseconds() as f64 / 1000.0));
        // A cycle that did not pass is opened, so its failures are visible without a click.
        let _ = writeln!(
            page,
            "<details class=\"cycle {class}\"{}>\n<summary><span class=\"badge {class}\">{}</span> \
             <time>{}</time> · {} · resource <code>{}</code> · {} failed of {}</summary>",
            if class == "ok" { "" } else { " open" },
            cycle.result.as_str(),
            time(cycle.started_at),
            duration,
            esc(&cycle.resource),
            cycle.failed_assertions,
            cycle.assertions.len()
        );
        render_assertions(page, &cycle.assertions);
        page.push_str("</details>\n");
    }
}

fn render_assertions(page: &mut String, assertions: &[AssertionDocument]) {
    if assertions.is_empty() {
        page.push_str("<p class=\"empty\">No assertions recorded.</p>\n");
        return;
    }
    page.push_str(
        "<table class=\"assertions\">\n<tr><th>assertion</th><th>phase</th><th>op</th>\
         <th>instance</th><th>expected</th><th>observed</th><th>time</th><th>detail</th></tr>\n",
    );
    for a in assertions {
        let class = if a.passed { "pass" } else { "fail" };
        let _ = writeln!(
            page,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&a.name),
            a.phase,
            a.op,
            esc(a.instance.as_deref().unwrap_or("—")),
            esc(a.expected.as_str()),
            esc(a.observed.as_str()),
            seconds(Some(a.duration_seconds)),
            esc(a.detail.as_deref().unwrap_or_default())
        );
    }
    page.push_str("</table>\n");
}

fn result_class(result: CycleResult) -> &'static str {
    match result {
        CycleResult::Passed => "ok",
        CycleResult::Failed => "fail",
        CycleResult::Error => "bad",
    }
}

/// A time as the status document shows it, in whole seconds.
fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> Option<String> {
    let secs = (now - then).num_milliseconds() as f64 / 1000.0;
    (secs >= 0.0).then(|| seconds(Some(secs)))
}

/// A duration for humans: µs and ms for routing costs, s for locks in tests, h/m for
/// production leases.
fn seconds(v: Option<f64>) -> String {
    let Some(s) = v.filter(|s| s.is_finite()) else {
        return "—".to_string();
    };
    let a = s.abs();
    if a == 0.0 {
        "0 s".to_string()
    } else if a < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if a < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if a < 60.0 {
        format!("{s:.2} s")
    } else if a < 3600.0 {
        format!("{}m {:02}s", (s / 60.0).floor(), (s % 60.0).floor())
    } else {
        format!("{}h {:02}m", (s / 3600.0).floor(), ((s % 3600.0) / 60.0).floor())
    }
}

/// A fragment id for a target: names are free text, ids must not contain spaces.
fn anchor(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// HTML-escapes text for element content and double- or single-quoted attributes.
///
/// Five characters cover both contexts; hand-written because it is that small and the
/// crate has no HTML templating dependency to borrow it from.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = "\
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:.6em 1.2em}
header h1{margin:0;font-size:1.3em}
.meta{margin:.2em 0 0;font-size:.9em}
main{padding:1em 1.2em}
section.target{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.4em 1em 1em;margin-bottom:1.2em}
h2{margin:.4em 0}
h3{margin:1em 0 .3em;font-size:1em}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;margin:.3em 0}
dt{font-weight:600}
dd{margin:0}
table{border-collapse:collapse;font-size:.9em}
th,td{border:1px solid #d0d7de;padding:.2em .5em;text-align:left}
th{background:#f6f8fa}
td{font-variant-numeric:tabular-nums}
tr.fail td,td.fail{background:#ffebe9;color:#82071e;font-weight:600}
details.cycle{margin:.3em 0}
details.cycle>summary{cursor:pointer}
details.cycle table{margin:.3em 0 .6em 1.2em}
.badge{display:inline-block;border-radius:1em;padding:0 .6em;font-size:.85em;font-weight:600}
.badge.ok{background:#dafbe1;color:#116329}
.badge.fail{background:#cf222e;color:#fff}
.badge.bad{background:#fff1e5;color:#953800}
.badge.unknown{background:#eaeef2;color:#57606a}
.bad{color:#953800;font-weight:600}
.warn{color:#9a6700;font-weight:600}
.empty{color:#57606a;font-style:italic}
code{font-size:.9em}
";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The document a JSON body of the status API reads as.
    fn doc(json: Value) -> StatusDocument {
        serde_json::from_value(json).unwrap()
    }

    fn sample() -> Value {
        json!({
            "generatedAt": "2026-11-29T22:40:00Z",
            "ready": true,
            "targets": [{
                "name": "demo",
                "instances": ["http://127.0.0.1:8080", "http://127.0.0.1:8081"],
                "lastSuccessAt": "2026-11-29T22:39:50Z",
                "missedSchedules": 0,
                "convergence": { "declaredSeconds": 3.0, "expectedSeconds": 3.0, "observedSeconds": 1.2 },
                "percentiles": {
                    "lockPhaseDurationSeconds": {
                        "preLock": { "count": 2, "p50": 3.1, "p75": 3.2, "p99": 3.3, "max": 3.3 },
                        "hardDelete": { "count": 2, "p50": 1.5, "p75": 1.5, "p99": 1.6, "max": 1.6 },
                        "write": { "count": 0, "p50": null, "p75": null, "p99": null, "max": null }
                    },
                    "readThroughLatencySeconds": { "count": 40, "p50": 0.001, "p75": 0.002, "p99": 0.004, "max": 0.005 },
                    "observedConvergenceSeconds": { "count": 4, "p50": 0.9, "p75": 1.0, "p99": 1.2, "max": 1.2 }
                },
                "lastCycles": [{
                    "startedAt": "2026-11-29T22:39:40Z", "finishedAt": "2026-11-29T22:39:50Z",
                    "result": "passed", "resource": "probe-0003",
                    "assertions": [{
                        "name": "hardDelete/delete", "phase": "hardDelete", "op": "delete",
                        "instance": "http://127.0.0.1:8080", "expected": "tombstone",
                        "observed": "tombstone", "passed": true, "durationSeconds": 0.004, "detail": null
                    }],
                    "failedAssertions": 0, "notes": []
                }]
            }]
        })
    }

    #[test]
    fn renders_a_complete_page_with_target_cycle_and_percentiles() {
        let html = render(&doc(sample()));
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
        assert!(html.contains("<h2>demo</h2>"));
        assert!(html.contains("badge ok\">ready"));
        // Last success with its age relative to generatedAt.
        assert!(html.contains("2026-11-29T22:39:50Z</time> (10.00 s ago)"), "{html}");
        // The cycle, its duration and its assertion.
        assert!(html.contains(
            "<time>2026-11-29T22:39:40Z</time> · 10.00 s · resource <code>probe-0003</code> · 0 failed of 1"
        ));
        assert!(html.contains("<tr class=\"pass\"><td>hardDelete/delete</td><td>hardDelete</td><td>delete</td>"));
        // Percentiles in human units; an empty summary renders as dashes.
        assert!(html.contains(
            "<th scope=\"row\">preLock hold</th><td>2</td><td>3.10 s</td><td>3.20 s</td><td>3.30 s</td><td>3.30 s</td>"
        ));
        assert!(html.contains("<th scope=\"row\">write hold</th><td>0</td><td>—</td><td>—</td><td>—</td><td>—</td>"));
        assert!(html.contains("<th scope=\"row\">read-through latency</th><td>40</td><td>1.0 ms</td><td>2.0 ms</td><td>4.0 ms</td><td>5.0 ms</td>"));
        // Convergence within the declared delay is not flagged.
        assert!(html.contains("<td>3.00 s</td><td>3.00 s</td><td>1.20 s</td>"));
        assert!(!html.contains("above declared"));
        // No scripts at all.
        assert!(!html.to_lowercase().contains("<script"));
        // A passed cycle stays collapsed.
        assert!(html.contains("<details class=\"cycle ok\">"));
    }

    #[test]
    fn escapes_every_free_text_string() {
        let mut status = sample();
        let evil = "<script>alert(\"x&y\")</script>'";
        let t = &mut status["targets"][0];
        t["name"] = json!(evil);
        t["instances"] = json!([evil]);
        let c = &mut t["lastCycles"][0];
        c["resource"] = json!(evil);
        let a = &mut c["assertions"][0];
        // Phase, operation and result are enums of the probe's own; outcomes carry what a
        // service said (a problem type) and are escaped like the rest.
        for key in ["name", "instance", "expected", "observed", "detail"] {
            a[key] = json!(evil);
        }
        let html = render(&doc(status));
        assert!(!html.contains("<script"), "unescaped markup in:\n{html}");
        assert!(!html.contains("alert(\"x"), "unescaped quote in:\n{html}");
        let escaped = "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;";
        // name, instance, resource, and the five assertion fields.
        assert_eq!(html.matches(escaped).count(), 8, "{html}");
        // The anchor id is derived from the name without markup characters.
        assert!(html.contains("id=\"target-_script_alert__x_y____script__\""));
    }

    #[test]
    fn renders_empty_targets_and_not_ready() {
        let html = render(&doc(json!({ "generatedAt": "2026-11-29T22:40:00Z", "ready": false, "targets": [] })));
        assert!(html.contains("No targets configured."));
        assert!(html.contains("badge bad\">not ready"));
        assert!(!html.contains("<section"));
    }

    #[test]
    fn highlights_a_failed_cycle_and_its_failed_assertion() {
        let mut status = sample();
        let t = &mut status["targets"][0];
        t["lastSuccessAt"] = Value::Null;
        t["missedSchedules"] = json!(2);
        t["lastCycles"] = json!([{
            "startedAt": "2026-11-29T22:39:55Z", "finishedAt": "2026-11-29T22:39:58.5Z",
            "result": "failed", "resource": "probe-0004",
            "assertions": [
                { "name": "write/write", "phase": "write", "op": "write", "instance": "http://127.0.0.1:8080",
                  "expected": "block", "observed": "allow", "passed": false, "durationSeconds": 0.003,
                  "detail": "PUT returned 200, expected 423" },
                { "name": "write/read", "phase": "write", "op": "read", "instance": "http://127.0.0.1:8080",
                  "expected": "allow", "observed": "allow", "passed": true, "durationSeconds": 0.002, "detail": null }
            ],
            "failedAssertions": 1, "notes": []
        }]);
        let html = render(&doc(status));
        assert!(html.contains("<details class=\"cycle fail\" open>"), "{html}");
        assert!(html.contains("<span class=\"badge fail\">failed</span>"));
        assert!(html.contains("3.50 s · resource <code>probe-0004</code> · 1 failed of 2"));
        assert!(html.contains("<tr class=\"fail\"><td>write/write</td><td>write</td><td>write</td><td>http://127.0.0.1:8080</td><td>block</td><td>allow</td><td>3.0 ms</td><td>PUT returned 200, expected 423</td></tr>"));
        assert!(html.contains("<tr class=\"pass\"><td>write/read</td>"));
        assert!(html.contains("<dt>Last success</dt><dd><span class=\"bad\">never</span></dd>"));
        assert!(html.contains("<dd class=\"warn\">2</dd>"));
        // The CSS rule for failed rows exists, so the highlight is visible.
        assert!(html.contains("tr.fail td"));
    }

    #[test]
    fn flags_observed_convergence_above_declared() {
        let mut status = sample();
        status["targets"][0]["convergence"] =
            json!({ "declaredSeconds": 3.0, "expectedSeconds": null, "observedSeconds": 4.5 });
        let html = render(&doc(status));
        assert!(html.contains("<td>3.00 s</td><td>—</td><td class=\"fail\">4.50 s — above declared</td>"), "{html}");
    }

    #[test]
    fn renders_a_target_with_nothing_recorded_yet() {
        let html = render(&doc(json!({
            "generatedAt": "2026-11-29T22:40:00Z", "ready": true,
            "targets": [{
                "name": "x", "instances": [], "lastSuccessAt": null, "missedSchedules": 0,
                "convergence": {}, "percentiles": {}, "lastCycles": []
            }]
        })));
        assert!(html.contains("No cycles yet."));
        assert!(html.contains("<dt>Instances</dt><dd>—</dd>"));
        assert!(html.contains("<td>—</td><td>—</td><td>—</td>"), "{html}");
        assert!(html.contains("<th scope=\"row\">preLock hold</th><td>0</td><td>—</td>"), "{html}");
    }

    #[test]
    fn formats_durations_across_scales() {
        assert_eq!(seconds(None), "—");
        assert_eq!(seconds(Some(f64::NAN)), "—");
        assert_eq!(seconds(Some(0.0)), "0 s");
        assert_eq!(seconds(Some(0.000_25)), "250 µs");
        assert_eq!(seconds(Some(0.0123)), "12.3 ms");
        assert_eq!(seconds(Some(19.0)), "19.00 s");
        assert_eq!(seconds(Some(305.0)), "5m 05s");
        assert_eq!(seconds(Some(48.0 * 3600.0 + 120.0)), "48h 02m");
    }
}
