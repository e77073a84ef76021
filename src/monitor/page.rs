//! The monitor's page at `/monitor`: the `/api/v1/monitor` document for people, one
//! self-contained HTML page (inline CSS and SVG; the same frame, palette and refresh as
//! the probe's status page, see [`crate::html`]).
//!
//! What an on-call engineer asks of the fleet, in order: what is migrating now (in-flight
//! migrations by phase), what is wrong (early escalations, orphaned locks, partial
//! cutovers, each with its resource id and age), and how long locks are held (the phase
//! hold distributions of the last day, the write lock's against the paper's production
//! figures, the escalation interval against the declared delay plus buffer). Documents
//! the monitor cannot read, if any, are listed after the anomalies: it is blind to
//! their migrations. The probe's
//! own test locks are shown apart, at the end: their lapses are the lease-lapse check's
//! design and their timings are the probe's to report.
//!
//! A pure function of [`MonitorStatus`]: ages count from its `generatedAt`; every resource
//! id is escaped (ids are whatever the fleet's documents hold).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

#[cfg(test)]
use super::status::UnreadableDocument;
use super::status::{AnomalyDocument, MigrationCounts, MonitorStatus, PhaseCounts};
use crate::html::{self, ago, esc, num, reference, seconds, time};
use crate::percentiles::Summary;

/// Where the page is served.
pub const PAGE_PATH: &str = "/monitor";

/// Renders the monitor's status document as a complete HTML page.
pub fn render(status: &MonitorStatus) -> String {
    let mut page = String::with_capacity(16 * 1024);
    let now = status.generated_at;
    let last_scan = match status.last_scan_at {
        Some(at) => format!("last scan {}", html::time_from_now(now, at)),
        None => "<span class=\"warn\">no full scan yet</span>".into(),
    };
    let region =
        status.store_region.as_deref().map(|r| format!(" · store region <code>{}</code>", esc(r))).unwrap_or_default();
    let meta = format!(
        "generated <time>{}</time> · {last_scan} · {} changes read, {} scans{region}",
        time(now),
        status.changes,
        status.scans
    );
    html::open(&mut page, "lockprobe monitor", "lockprobe monitor", PAGE_PATH, &meta, &[]);
    render_in_flight(&mut page, status);
    render_anomalies(&mut page, status);
    render_unreadable(&mut page, status);
    render_holds(&mut page, status);
    render_probe(&mut page, status);
    html::close(&mut page);
    page
}

/// The phases in lifecycle order, with their counts.
fn by_phase(c: &PhaseCounts) -> [(&'static str, usize); 3] {
    [("preLock", c.pre_lock), ("hardDelete", c.hard_delete), ("write", c.write)]
}

fn render_in_flight(page: &mut String, status: &MonitorStatus) {
    page.push_str("<section class=\"card\" id=\"in-flight\">\n<h2>In flight</h2>\n");
    let _ = writeln!(
        page,
        "<p>{} migration{} of the fleet hold a live lock.</p>",
        status.in_flight,
        if status.in_flight == 1 { "" } else { "s" }
    );
    let phases = by_phase(&status.in_flight_by_phase);
    let max = phases.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1) as f64;
    let (label_w, bar_w, row) = (96.0, 240.0, 22.0);
    let described: Vec<String> = phases.iter().map(|(p, n)| format!("{p} {n}")).collect();
    let _ = write!(
        page,
        "<svg class=\"chart bars\" style=\"max-width:32em\" viewBox=\"0 0 {} {}\" role=\"img\" \
         aria-labelledby=\"in-flight-title in-flight-desc\"><title id=\"in-flight-title\">Fleet migrations in flight by phase</title>\
         <desc id=\"in-flight-desc\">{}</desc>",
        num(label_w + bar_w + 48.0),
        num(row * 3.0 + 4.0),
        esc(&described.join(", "))
    );
    for (i, (phase, n)) in phases.iter().enumerate() {
        let y = 2.0 + row * i as f64;
        let w = bar_w * *n as f64 / max;
        let _ = write!(
            page,
            "<text x=\"4\" y=\"{}\">{phase}</text><rect class=\"s{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"14\" rx=\"2\"/>\
             <text x=\"{}\" y=\"{}\">{n}</text>",
            num(y + 13.0),
            i + 1,
            num(label_w),
            num(y + 2.0),
            num(w.max(1.0)),
            num(label_w + w + 6.0),
            num(y + 13.0)
        );
    }
    page.push_str("</svg>\n");
    render_outcomes(page, "Migrations ended since the monitor started", &status.migrations, status.renewals);
    page.push_str("</section>\n");
}

fn render_outcomes(page: &mut String, caption: &str, m: &MigrationCounts, renewals: u64) {
    let _ = writeln!(
        page,
        "<div class=\"scroll\" tabindex=\"0\"><table><caption class=\"note\">{}</caption>\n<tr><th>swapped</th><th>released</th>\
         <th>lapsed</th><th>force-released</th><th>renewals seen</th></tr>\n<tr><td>{}</td><td>{}</td><td{}>{}</td><td{}>{}</td><td>{}</td></tr>\n</table></div>",
        esc(caption),
        m.swapped,
        m.released,
        if m.lapsed > 0 { " class=\"warn\"" } else { "" },
        m.lapsed,
        if m.force_released > 0 { " class=\"warn\"" } else { "" },
        m.force_released,
        renewals
    );
}

/// Early escalations, partial cutovers and orphaned locks of the fleet, each listed with
/// its resource and age.
fn render_anomalies(page: &mut String, status: &MonitorStatus) {
    let now = status.generated_at;
    let fleet: Vec<&AnomalyDocument> = status.recent_anomalies.iter().filter(|a| a.source != "probe").collect();
    let total =
        status.early_escalations + status.partial_cutovers + status.force_releases + status.orphaned_locks as u64;
    let _ = writeln!(
        page,
        "<section class=\"card\" id=\"anomalies\">\n<h2>Anomalies {}</h2>",
        if total == 0 {
            "<span class=\"badge ok\">none</span>".to_string()
        } else {
            format!("<span class=\"badge fail\">{total}</span>")
        }
    );
    let buffer = seconds(Some(status.escalation_buffer_seconds));
    let sections: [(&str, &str, u64, String); 3] = [
        (
            "early_escalation",
            "Early escalations",
            status.early_escalations,
            format!(
                "hardDelete before the declared delay + the {buffer} buffer: caches may still serve the old location"
            ),
        ),
        (
            "partial_cutover",
            "Partial cutovers",
            status.partial_cutovers,
            "location and lock disagree: the location moved under the lock, or the lock stayed at the target".into(),
        ),
        (
            "force_release",
            "Force-releases",
            status.force_releases,
            "a lock removed by two admin principals while its holder was lost: who and why are in the monitor's log and the resource's audit trail (lockprobe admin force-release list)".into(),
        ),
    ];
    for (kind, title, count, why) in sections {
        let listed: Vec<&&AnomalyDocument> = fleet.iter().filter(|a| a.kind == kind).collect();
        anomaly_heading(page, kind, title, count, &why);
        if listed.is_empty() {
            if count > 0 {
                page.push_str("<p class=\"note\">None among the recent anomalies kept.</p>\n");
            }
            continue;
        }
        resource_table(page, now, ["seen", "age"], listed.iter().map(|a| (a.resource.as_str(), a.at)));
    }
    anomaly_heading(
        page,
        "orphaned_lock",
        "Orphaned locks",
        status.orphaned_locks as u64,
        "a lease ran out with the lock still in the document, never released or swapped",
    );
    if !status.orphans.is_empty() {
        let rows = status.orphans.iter().map(|o| (o.resource.as_str(), o.lease_ended_at));
        resource_table(page, now, ["lease ended", "orphaned for"], rows);
        if status.orphaned_locks > status.orphans.len() {
            let _ = writeln!(
                page,
                "<p class=\"note\">The {} longest orphaned of {}.</p>",
                status.orphans.len(),
                status.orphaned_locks
            );
        }
    }
    page.push_str("</section>\n");
}

/// The documents the monitor cannot read, when there are any: their migrations are not
/// followed, so an anomaly in them would go unseen.
fn render_unreadable(page: &mut String, status: &MonitorStatus) {
    if status.unreadable_documents == 0 {
        return;
    }
    let _ = writeln!(
        page,
        "<section class=\"card\" id=\"unreadable\">\n<h2>Unreadable documents <span class=\"badge bad\">{}</span></h2>\n\
         <p class=\"note\">Skipped: their migrations are not followed. <code>unsupported-format</code> is a format \
         this monitor does not read (a newer library wrote it: upgrade the monitor); <code>malformed</code> is no \
         location document.</p>",
        status.unreadable_documents
    );
    page.push_str(
        "<div class=\"scroll\" tabindex=\"0\"><table>\n\
         <tr><th>resource</th><th>reason</th><th>committed</th><th>age</th></tr>\n",
    );
    for u in &status.unreadable {
        let _ = writeln!(
            page,
            "<tr><td><code>{}</code></td><td>{}</td><td><time>{}</time></td><td>{}</td></tr>",
            esc(&u.resource),
            esc(&u.reason),
            time(u.committed_at),
            age(status.generated_at, u.committed_at)
        );
    }
    page.push_str("</table></div>\n");
    if status.unreadable_documents > status.unreadable.len() {
        let _ = writeln!(
            page,
            "<p class=\"note\">The first {} by id of {}.</p>",
            status.unreadable.len(),
            status.unreadable_documents
        );
    }
    page.push_str("</section>\n");
}

/// A table of resources, each with a moment (`headers[0]`) and how long ago it was
/// (`headers[1]`), every row marked failed.
fn resource_table<'a>(
    page: &mut String,
    now: DateTime<Utc>,
    headers: [&str; 2],
    rows: impl Iterator<Item = (&'a str, DateTime<Utc>)>,
) {
    let _ = writeln!(
        page,
        "<div class=\"scroll\" tabindex=\"0\"><table>\n<tr><th>resource</th><th>{}</th><th>{}</th></tr>",
        headers[0], headers[1]
    );
    for (resource, at) in rows {
        let _ = writeln!(
            page,
            "<tr class=\"fail\"><td><code>{}</code></td><td><time>{}</time></td><td>{}</td></tr>",
            esc(resource),
            time(at),
            ago(now, at).unwrap_or_else(|| "—".into())
        );
    }
    page.push_str("</table></div>\n");
}

fn anomaly_heading(page: &mut String, kind: &str, title: &str, count: u64, why: &str) {
    let _ = writeln!(
        page,
        "<h3 id=\"{kind}\">{title}: <span class=\"{}\">{count}</span></h3>\n<p class=\"note\">{}</p>",
        if count > 0 { "bad" } else { "ok" },
        esc(why)
    );
}

/// Reference values drawn on a distribution, with their labels.
type References = Vec<(f64, String)>;

/// Phase holds and the escalation interval of the fleet over the window, each drawn as a
/// distribution (p50 to p99 as a bar, max as a tick) against its reference.
fn render_holds(page: &mut String, status: &MonitorStatus) {
    let window = match status.window_seconds {
        Some(w) => format!(
            "the fleet's migrations the monitor saw end a phase over the last {} (since it started, if later; kept in quarters: between {} and {} back)",
            seconds(Some(w)),
            seconds(Some(w * 0.75)),
            seconds(Some(w))
        ),
        None => "the fleet's migrations the monitor saw end a phase since it started".into(),
    };
    let _ = writeln!(
        page,
        "<section class=\"card\" id=\"holds\">\n<h2>Phase holds</h2>\n<p class=\"note\">Exact percentiles of {}.</p>",
        esc(&window)
    );
    let required = status.declared_delay_seconds.map(|d| d + status.escalation_buffer_seconds);
    let p = &status.phase_duration_seconds;
    let rows: [(&str, &Summary, References); 4] = [
        ("preLock hold", &p.pre_lock, vec![]),
        ("hardDelete hold", &p.hard_delete, vec![]),
        (
            "write hold",
            &p.write,
            vec![
                (reference::WRITE_HOLD_P50_SECONDS, "paper p50".into()),
                (reference::WRITE_HOLD_P99_SECONDS, "paper p99".into()),
            ],
        ),
        (
            "pre-lock → hardDelete",
            &status.escalation_interval_seconds,
            required.map(|r| vec![(r, "declared + buffer".to_string())]).unwrap_or_default(),
        ),
    ];
    page.push_str(
        "<div class=\"scroll\" tabindex=\"0\"><table class=\"holds\">\n<tr><th>measure</th><th>distribution</th><th>count</th>\
         <th>p50</th><th>p75</th><th>p99</th><th>max</th><th>against</th></tr>\n",
    );
    for (i, (label, s, refs)) in rows.iter().enumerate() {
        let _ = writeln!(
            page,
            "<tr><th scope=\"row\">{label}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            distribution(i, label, s, refs, &window),
            s.count,
            seconds(s.p50),
            seconds(s.p75),
            seconds(s.p99),
            seconds(s.max),
            verdict(label, s, refs)
        );
    }
    page.push_str("</table></div>\n");
    let _ = writeln!(
        page,
        "<p class=\"note\">The paper's production write lock: p50 {}, p99 {}. Escalations are judged against the \
         declared delay{} plus the {} buffer.</p>\n</section>",
        seconds(Some(reference::WRITE_HOLD_P50_SECONDS)),
        seconds(Some(reference::WRITE_HOLD_P99_SECONDS)),
        status.declared_delay_seconds.map(|d| format!(" ({})", seconds(Some(d)))).unwrap_or_default(),
        seconds(Some(status.escalation_buffer_seconds))
    );
}

/// How a measure stands against its references: the write hold's p50 and p99 against the
/// paper's, the escalation interval's p50 against the declared delay plus buffer (below
/// it is early).
fn verdict(label: &str, s: &Summary, refs: &[(f64, String)]) -> String {
    if s.count == 0 || refs.is_empty() {
        return "—".into();
    }
    if label.starts_with("write") {
        let (p50, p99) = (refs[0].0, refs.get(1).map_or(refs[0].0, |r| r.0));
        let above = matches!(s.p99, Some(v) if v > p99) || matches!(s.p50, Some(v) if v > p50);
        return if above {
            format!(
                "<span class=\"warn\">above the paper's p50 {} / p99 {}</span>",
                seconds(Some(p50)),
                seconds(Some(p99))
            )
        } else {
            format!(
                "<span class=\"ok\">within the paper's p50 {} / p99 {}</span>",
                seconds(Some(p50)),
                seconds(Some(p99))
            )
        };
    }
    let required = refs[0].0;
    match s.p50 {
        Some(v) if v < required => format!("<span class=\"bad\">p50 below {} (early)</span>", seconds(Some(required))),
        _ => format!("<span class=\"ok\">at or above {}</span>", seconds(Some(required))),
    }
}

/// One distribution as a small SVG: the range to max as a thin line, p50 to p99 as a
/// bar, p50 as a dot, max as a tick, references as dashed lines with their label.
fn distribution(row: usize, label: &str, s: &Summary, refs: &[(f64, String)], window: &str) -> String {
    let (w, h, pad) = (220.0, 44.0, 6.0);
    // Room on the right for the labels of references near the top.
    let top = refs.iter().map(|r| r.0).chain(s.max).fold(0.0_f64, f64::max) * 1.15;
    let listed = format!(
        "{} values; p50 {}, p75 {}, p99 {}, max {}{}",
        s.count,
        seconds(s.p50),
        seconds(s.p75),
        seconds(s.p99),
        seconds(s.max),
        refs.iter().map(|(v, l)| format!("; {l} {}", seconds(Some(*v)))).collect::<String>()
    );
    let mut svg = format!(
        "<svg class=\"spark\" style=\"width:14em;height:2.8em\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{label}: {}\">\
         <title>{label} over {}</title><desc>{}</desc>",
        esc(&listed),
        esc(window),
        esc(&listed)
    );
    if s.count == 0 {
        svg.push_str("<text class=\"axis\" x=\"4\" y=\"20\">nothing recorded</text></svg>");
        return svg;
    }
    // Every value zero (escalations in one instant) still draws, at the left.
    let top = top.max(1e-3);
    let x = |v: f64| pad + (w - 2.0 * pad) * (v / top).clamp(0.0, 1.0);
    let y = 12.0;
    if let Some(max) = s.max {
        let _ = write!(
            svg,
            "<line class=\"axisline\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\"/><line class=\"axisline\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
            num(x(0.0)),
            num(x(max)),
            num(x(max)),
            num(y - 5.0),
            num(x(max)),
            num(y + 5.0)
        );
    }
    if let (Some(p50), Some(p99)) = (s.p50, s.p99) {
        let _ = write!(
            svg,
            "<rect class=\"s{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"8\" rx=\"2\"/><circle class=\"dot\" cx=\"{}\" cy=\"{y}\" r=\"3\"/>",
            row + 1,
            num(x(p50)),
            num(y - 4.0),
            num((x(p99) - x(p50)).max(2.0)),
            num(x(p50))
        );
    }
    for (i, (v, l)) in refs.iter().enumerate() {
        let rx = num(x(*v));
        // Labels end at their line, so the rightmost stays inside the chart; every second
        // one a line lower, so two close references do not print over each other.
        let (anchor, dx) = ("end", -2.0);
        let label_y = 32.0 + 10.0 * (i % 2) as f64;
        let _ = write!(
            svg,
            "<line class=\"refline\" x1=\"{rx}\" y1=\"2\" x2=\"{rx}\" y2=\"{}\"/><text class=\"ref\" x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\">{}</text>",
            num(label_y - 10.0),
            num(x(*v) + dx),
            num(label_y),
            esc(l)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The probe's own test locks, apart from the fleet's.
fn render_probe(page: &mut String, status: &MonitorStatus) {
    let p = &status.probe;
    let now = status.generated_at;
    page.push_str(
        "<section class=\"card\" id=\"probe-locks\">\n<h2>The probe's test locks</h2>\n<p class=\"note\">Locks whose owner \
         is <code>lockprobe/&lt;target&gt;</code>, kept apart from the fleet's: the expired lock the probe's lease-lapse \
         check leaves until its next cycle is there by design.</p>\n",
    );
    let phases: Vec<String> = by_phase(&p.in_flight_by_phase).iter().map(|(ph, n)| format!("{ph} {n}")).collect();
    let _ = writeln!(
        page,
        "<dl class=\"summary\">\n<dt>In flight</dt><dd>{} ({})</dd>\n<dt>Expired, left by design</dt><dd>{}</dd>\n\
         <dt>Early escalations</dt><dd{}>{}</dd>\n<dt>Partial cutovers</dt><dd{}>{}</dd>\n</dl>",
        p.in_flight,
        phases.join(", "),
        p.orphaned_locks,
        if p.early_escalations > 0 { " class=\"bad\"" } else { "" },
        p.early_escalations,
        if p.partial_cutovers > 0 { " class=\"bad\"" } else { "" },
        p.partial_cutovers
    );
    render_outcomes(page, "The probe's migrations ended since the monitor started", &p.migrations, p.renewals);
    let probe_anomalies: Vec<&AnomalyDocument> =
        status.recent_anomalies.iter().filter(|a| a.source == "probe").collect();
    if !probe_anomalies.is_empty() {
        page.push_str(
            "<div class=\"scroll\" tabindex=\"0\"><table>\n<tr><th>anomaly</th><th>resource</th><th>age</th></tr>\n",
        );
        for a in probe_anomalies {
            let _ = writeln!(
                page,
                "<tr class=\"fail\"><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(&a.kind),
                esc(&a.resource),
                age(now, a.at)
            );
        }
        page.push_str("</table></div>\n");
    }
    page.push_str("</section>\n");
}

fn age(now: DateTime<Utc>, at: DateTime<Utc>) -> String {
    ago(now, at).unwrap_or_else(|| "—".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status() -> MonitorStatus {
        serde_json::from_value(json!({
            "generatedAt": "2026-11-29T22:40:00Z",
            "inFlight": 5,
            "inFlightByPhase": { "preLock": 3, "hardDelete": 1, "write": 1 },
            "orphanedLocks": 2,
            "orphanIds": ["res-0001", "res-<b>"],
            "orphans": [
                { "resource": "res-0001", "leaseEndedAt": "2026-11-29T22:30:00Z" },
                { "resource": "res-<b>", "leaseEndedAt": "2026-11-29T22:39:30Z" }
            ],
            "migrations": { "swapped": 10, "released": 1, "lapsed": 2 },
            "earlyEscalations": 1,
            "partialCutovers": 1,
            "renewals": 4,
            "changes": 100,
            "scans": 3,
            "lastScanAt": "2026-11-29T22:39:50Z",
            "escalationBufferSeconds": 5.0,
            "declaredDelaySeconds": 10.0,
            "probe": {
                "inFlight": 1, "inFlightByPhase": { "preLock": 0, "hardDelete": 0, "write": 1 },
                "orphanedLocks": 1, "migrations": { "swapped": 7, "released": 3, "lapsed": 1 },
                "earlyEscalations": 0, "partialCutovers": 0, "renewals": 36
            },
            "recentAnomalies": [
                { "kind": "early_escalation", "resource": "res-0042", "at": "2026-11-29T22:39:00Z", "source": "fleet" },
                { "kind": "partial_cutover", "resource": "res-0043", "at": "2026-11-29T22:38:00Z" },
                { "kind": "early_escalation", "resource": "probe-0001", "at": "2026-11-29T22:37:00Z", "source": "probe" }
            ],
            "phaseDurationSeconds": {
                "preLock": { "count": 10, "p50": 15.0, "p75": 16.0, "p99": 20.0, "max": 21.0 },
                "hardDelete": { "count": 10, "p50": 5.0, "p75": 6.0, "p99": 8.0, "max": 9.0 },
                "write": { "count": 10, "p50": 14.0, "p75": 16.0, "p99": 22.0, "max": 25.0 }
            },
            "escalationIntervalSeconds": { "count": 10, "p50": 16.0, "p75": 17.0, "p99": 20.0, "max": 21.0 },
            "windowSeconds": 86400.0
        }))
        .unwrap()
    }

    #[test]
    fn lists_anomalies_with_resource_and_age() {
        let html = render(&status());
        assert!(html.contains("<h2>Anomalies <span class=\"badge fail\">4</span></h2>"), "{html}");
        assert!(html.contains("<h3 id=\"early_escalation\">Early escalations: <span class=\"bad\">1</span></h3>"));
        assert!(html.contains("<tr class=\"fail\"><td><code>res-0042</code></td><td><time>2026-11-29T22:39:00Z</time></td><td>1m 00s</td></tr>"), "{html}");
        // An anomaly of an earlier document without a source counts as the fleet's.
        assert!(html.contains("<code>res-0043</code></td><td><time>2026-11-29T22:38:00Z</time></td><td>2m 00s</td>"));
        // Orphans with how long their lease has been over, escaped.
        assert!(
            html.contains("<td><code>res-0001</code></td><td><time>2026-11-29T22:30:00Z</time></td><td>10m 00s</td>")
        );
        assert!(html.contains("<code>res-&lt;b&gt;</code>"));
        assert!(!html.contains("res-<b>"));
    }

    #[test]
    fn shows_in_flight_by_phase_and_the_probe_apart() {
        let html = render(&status());
        assert!(html.contains("<p>5 migrations of the fleet hold a live lock.</p>"));
        assert!(html.contains("<desc id=\"in-flight-desc\">preLock 3, hardDelete 1, write 1</desc>"));
        // The probe's early escalation is listed under the probe, not the fleet.
        let probe = &html[html.find("id=\"probe-locks\"").unwrap()..];
        let fleet = &html[..html.find("id=\"probe-locks\"").unwrap()];
        assert!(probe.contains("<td>early_escalation</td><td><code>probe-0001</code></td><td>3m 00s</td>"), "{probe}");
        assert!(!fleet.contains("probe-0001"));
        assert!(probe.contains("<dt>In flight</dt><dd>1 (preLock 0, hardDelete 0, write 1)</dd>"));
        assert!(probe.contains("<dt>Expired, left by design</dt><dd>1</dd>"));
        // The probe's own renewals, not a zero put in their place.
        assert!(probe.contains("<td class=\"warn\">1</td><td>0</td><td>36</td>"), "{probe}");
    }

    #[test]
    fn draws_holds_against_the_papers_figures() {
        let html = render(&status());
        // The write hold: p50 14 s and p99 22 s are above the paper's 13 s / 19 s.
        assert!(html.contains("<span class=\"warn\">above the paper's p50 13.00 s / p99 19.00 s</span>"), "{html}");
        assert!(html.contains("<text class=\"ref\""));
        assert!(html.contains("paper p99</text>"));
        // The escalation interval's p50 (16 s) is above declared + buffer (15 s).
        assert!(html.contains("<span class=\"ok\">at or above 15.00 s</span>"));
        // Text alternatives name the window.
        assert!(
            html.contains(
                "<title>write hold over the fleet&#39;s migrations the monitor saw end a phase over the last 24h 00m"
            ),
            "{html}"
        );
        assert!(html.contains("aria-label=\"write hold: 10 values; p50 14.00 s, p75 16.00 s, p99 22.00 s, max 25.00 s; paper p50 13.00 s; paper p99 19.00 s\""));
    }

    #[test]
    fn a_quiet_fleet_says_so() {
        let quiet = MonitorStatus {
            early_escalations: 0,
            partial_cutovers: 0,
            orphaned_locks: 0,
            orphans: vec![],
            orphan_ids: vec![],
            recent_anomalies: vec![],
            last_scan_at: None,
            ..status()
        };
        let html = render(&quiet);
        assert!(!html.contains("id=\"unreadable\""), "no section while every document reads");
        assert!(html.contains("<h2>Anomalies <span class=\"badge ok\">none</span></h2>"));
        assert!(html.contains("<span class=\"warn\">no full scan yet</span>"));
        assert!(!html.contains("<tr class=\"fail\">"));
    }

    #[test]
    fn lists_the_documents_it_cannot_read() {
        let blind = MonitorStatus {
            unreadable_documents: 3,
            unreadable: vec![UnreadableDocument {
                resource: "res-<9>".into(),
                reason: "unsupported-format".into(),
                committed_at: "2026-11-29T22:35:00Z".parse().unwrap(),
            }],
            ..status()
        };
        let html = render(&blind);
        assert!(html.contains("<h2>Unreadable documents <span class=\"badge bad\">3</span></h2>"), "{html}");
        assert!(html.contains("<tr><td><code>res-&lt;9&gt;</code></td><td>unsupported-format</td><td><time>2026-11-29T22:35:00Z</time></td><td>5m 00s</td></tr>"), "{html}");
        assert!(html.contains("The first 1 by id of 3."));
    }
}
