//! The human status page served at `/`: the `/api/v1/status` document rendered as one
//! self-contained HTML page (inline CSS and SVG, no external asset), so an on-call
//! engineer can read it in any browser, offline, without JavaScript; a small inline
//! script only refreshes it in place (see [`crate::html`]).
//!
//! Per target: a summary; the history of the last cycles (a strip of results and
//! sparklines of the phase holds and the read-through p99, each naming the cycles it
//! covers); convergence; percentiles, labelled with the window they cover; and the last
//! cycles, the newest [`TIMELINES`] of them drawn as a timeline (the main walk's steps
//! as bars on a time axis, the declared delay and the buffer marked, the moment each
//! instance showed the lock, every assertion a tick, every failure a numbered cross
//! named by phase, operation and instance), with one `<details>` per step listing its
//! assertions. A cycle or step that failed is open without a click.
//!
//! The renderer is a pure function of the status document ([`StatusDocument`], the type
//! `GET /api/v1/status` serves): "ago" times are relative to its `generatedAt`, not to a
//! clock, and an absent value renders as "—". Every free-text string is HTML-escaped:
//! target names, resources, outcomes and assertion details come from configuration and
//! from the target's responses, which the probe does not trust.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::metrics::PercentilesDocument;
use super::status::{
    AssertionDocument, ConvergenceDocument, CycleDocument, ScheduleDocument, StatusDocument, TargetDocument,
};
use crate::html::{self, anchor, esc, num, seconds, time};
use crate::percentiles::Summary;
use crate::probe::checks::report::CycleResult;
use crate::probe::checks::vocabulary::Phase;

/// How many of the newest cycles of a target are drawn as a timeline.
pub const TIMELINES: usize = 5;

/// Renders the status document (the body of `GET /api/v1/status`) as a complete HTML page.
pub fn render(status: &StatusDocument) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let (ready_class, ready_text) = if status.ready { ("ok", "ready") } else { ("bad", "not ready") };
    let (health_class, health_text) = health(&status.targets);
    let meta = format!(
        "<span class=\"badge {ready_class}\">{ready_text}</span> <span class=\"badge {health_class}\">{}</span> generated <time>{}</time>",
        esc(&health_text),
        time(status.generated_at)
    );
    html::open(&mut page, "lockprobe status", "lockprobe", "/", &meta, &[]);
    if status.targets.is_empty() {
        page.push_str("<p class=\"empty\">No targets configured.</p>\n");
    }
    for target in &status.targets {
        render_target(&mut page, target, status.generated_at);
    }
    html::close(&mut page);
    page
}

/// The worst target, for the header: "ready" says the process runs, this says whether
/// what it probes holds. A target is failing when its newest cycle did not pass; one that
/// has not passed yet (no cycle, or none finished) is counted apart.
fn health(targets: &[TargetDocument]) -> (&'static str, String) {
    let plural = |n: usize| if n == 1 { "target" } else { "targets" };
    let failing =
        targets.iter().filter(|t| t.last_cycles.first().is_some_and(|c| c.result != CycleResult::Passed)).count();
    let waiting = targets.iter().filter(|t| t.last_cycles.is_empty() && t.last_success_at.is_none()).count();
    if failing > 0 {
        return ("fail", format!("{failing} of {} {} failing", targets.len(), plural(targets.len())));
    }
    if waiting > 0 {
        return ("pending", format!("{waiting} {} without a cycle yet", plural(waiting)));
    }
    if targets.is_empty() {
        return ("pending", "no targets".into());
    }
    match targets.len() {
        1 => ("ok", "target passing".into()),
        n => ("ok", format!("all {n} targets passing")),
    }
}

fn render_target(page: &mut String, target: &TargetDocument, now: DateTime<Utc>) {
    let name = &target.name;
    let _ =
        writeln!(page, "<section class=\"card target\" id=\"target-{}\">\n<h2>{}</h2>", esc(&anchor(name)), esc(name));

    // Summary: instances, last success, missed schedules.
    page.push_str("<dl class=\"summary\">\n");
    let instances: Vec<String> =
        target.instances.iter().enumerate().map(|(i, url)| format!("i{} <code>{}</code>", i + 1, esc(url))).collect();
    let _ = writeln!(
        page,
        "<dt>Instances</dt><dd>{}</dd>",
        if instances.is_empty() { "—".to_string() } else { instances.join(", ") }
    );
    let last_success = match target.last_success_at {
        None => "<span class=\"bad\">never</span>".to_string(),
        Some(at) => html::time_from_now(now, at),
    };
    let _ = writeln!(page, "<dt>Last success</dt><dd>{last_success}</dd>");
    render_schedule(page, target.schedule.as_ref(), now);
    let missed_class = if target.missed_schedules > 0 { " class=\"warn\"" } else { "" };
    let _ = writeln!(page, "<dt>Missed schedules</dt><dd{missed_class}>{}</dd>\n</dl>", target.missed_schedules);

    render_history(page, name, &target.last_cycles);
    render_convergence(page, &target.convergence);
    render_percentiles(page, &target.percentiles);
    render_cycles(page, target);
    page.push_str("</section>\n");
}

/// The schedule, its last and next firing, as `<dt>`/`<dd>` pairs of the summary.
fn render_schedule(page: &mut String, schedule: Option<&ScheduleDocument>, now: DateTime<Utc>) {
    let Some(s) = schedule else {
        page.push_str("<dt>Schedule</dt><dd>not started yet</dd>\n");
        return;
    };
    let every = s.interval_seconds.map(|i| format!(" (every {})", seconds(Some(i)))).unwrap_or_default();
    let _ = writeln!(page, "<dt>Schedule</dt><dd><code>{}</code>{every}</dd>", esc(&s.expression));
    let last = match s.last_firing_at {
        None => "none yet".to_string(),
        Some(at) => html::time_from_now(now, at),
    };
    let _ = writeln!(page, "<dt>Last firing</dt><dd>{last}</dd>");
    let next = match s.next_firing_at {
        None => "<span class=\"bad\">none: the schedule has no further firing</span>".to_string(),
        Some(at) => html::time_from_now(now, at),
    };
    let _ = writeln!(page, "<dt>Next firing</dt><dd>{next}</dd>");
}

/// The id of a cycle's `<details>`: stable across refreshes, so the refresh script keeps
/// it open or closed.
fn cycle_id(target: &str, cycle: &CycleDocument) -> String {
    format!("cycle-{}-{}-{}", anchor(target), cycle.started_at.timestamp(), anchor(&cycle.resource))
}

/// The cycles a history covers, named: "the last 3 cycles, 22:39:10 to 22:39:40 UTC".
fn window_name(cycles: &[CycleDocument]) -> String {
    let (Some(newest), Some(oldest)) = (cycles.first(), cycles.last()) else {
        return "no cycles yet".into();
    };
    let hms = |t: DateTime<Utc>| t.format("%H:%M:%S").to_string();
    let span = if oldest.started_at.date_naive() == newest.started_at.date_naive() {
        format!("{} to {} UTC", hms(oldest.started_at), hms(newest.started_at))
    } else {
        format!("{} to {}", time(oldest.started_at), time(newest.started_at))
    };
    match cycles.len() {
        1 => format!("the last cycle, started {} UTC", hms(newest.started_at)),
        n => format!("the last {n} cycles, started {span}"),
    }
}

/// A strip of the last cycles' results (oldest left, each a link to the cycle below, so
/// the strip is a group of links rather than one image) and
/// sparklines of the phase holds and the read-through p99, over the same cycles.
fn render_history(page: &mut String, target: &str, cycles: &[CycleDocument]) {
    if cycles.is_empty() {
        return;
    }
    let window = window_name(cycles);
    let _ = writeln!(page, "<h3>History</h3>\n<p class=\"note\">Over {}.</p>", esc(&window));
    let (passed, failed, errors) = cycles.iter().fold((0, 0, 0), |(p, f, e), c| match c.result {
        CycleResult::Passed => (p + 1, f, e),
        CycleResult::Failed => (p, f + 1, e),
        CycleResult::Error => (p, f, e + 1),
    });
    let cell = 20.0;
    let width = cell * cycles.len() as f64 + 4.0;
    let _ = write!(
        page,
        "<svg class=\"chart strip\" style=\"max-width:{}px\" viewBox=\"0 0 {} 24\" role=\"group\" \
         aria-label=\"Results of {}: {passed} passed, {failed} failed, {errors} error\">\
         <title>Results of {}</title><desc>Oldest first: {}</desc>",
        num(width * 1.2),
        num(width),
        esc(&window),
        esc(&window),
        esc(&cycles.iter().rev().map(|c| c.result.as_str()).collect::<Vec<_>>().join(", "))
    );
    for (i, c) in cycles.iter().rev().enumerate() {
        let cx = 2.0 + cell * i as f64 + cell / 2.0;
        let shape = match c.result {
            CycleResult::Passed => format!("<circle class=\"pass\" cx=\"{}\" cy=\"12\" r=\"6\"/>", num(cx)),
            CycleResult::Failed => cross_path("failed", cx, 12.0, 7.0),
            CycleResult::Error => {
                format!("<polygon class=\"error\" points=\"{},5 {},18 {},18\"/>", num(cx), num(cx - 7.0), num(cx + 7.0))
            }
        };
        let _ = write!(
            page,
            "<a href=\"#{}\"><title>{} {}: {} failed of {}</title>{shape}</a>",
            esc(&cycle_id(target, c)),
            time(c.started_at),
            c.result.as_str(),
            c.failed_assertions,
            c.assertions.len()
        );
    }
    page.push_str("</svg>\n");
    page.push_str(
        "<ul class=\"legend\"><li><span class=\"ok\">●</span> passed</li>\
         <li><span class=\"fail-mark\">✕</span> failed</li><li><span class=\"bad\">▲</span> error</li></ul>\n",
    );
    // Oldest first, like the strip.
    let series =
        |f: &dyn Fn(&CycleDocument) -> Option<f64>| -> Vec<Option<f64>> { cycles.iter().rev().map(f).collect() };
    let reads: usize = cycles.iter().map(|c| c.read_through_reads).max().unwrap_or(0);
    let rows: [(String, Vec<Option<f64>>); 4] = [
        (format!("{} hold", Phase::PreLock), series(&|c| c.phase_hold_seconds.pre_lock)),
        (format!("{} hold", Phase::HardDelete), series(&|c| c.phase_hold_seconds.hard_delete)),
        (format!("{} hold", Phase::Write), series(&|c| c.phase_hold_seconds.write)),
        (format!("read-through p99 (of up to {reads} reads per cycle)"), series(&|c| c.read_through_p99_seconds)),
    ];
    page.push_str(
        "<div class=\"scroll\" tabindex=\"0\"><table class=\"spark\">\n<tr><th>per cycle</th><th>oldest → newest</th>\
         <th>newest</th><th>max</th></tr>\n",
    );
    for (label, values) in rows {
        let max = values.iter().flatten().copied().reduce(f64::max);
        let _ = writeln!(
            page,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&label),
            html::sparkline(&values, &format!("{label} per cycle"), &window),
            seconds(values.last().copied().flatten()),
            seconds(max)
        );
    }
    page.push_str("</table></div>\n");
}

/// Declared against observed convergence; observed above declared is the unsafe case (the
/// orchestrator would escalate before caches converged), so it is flagged.
fn render_convergence(page: &mut String, conv: &ConvergenceDocument) {
    let (declared, observed) = (conv.declared_seconds, conv.observed_seconds);
    let unsafe_ = matches!((observed, declared), (Some(o), Some(d)) if o > d);
    page.push_str("<h3>Convergence</h3>\n<p class=\"note\">Declared with the last pre-lock; observed: the slowest instance of the last cycle.</p>\n");
    page.push_str("<div class=\"scroll\" tabindex=\"0\"><table class=\"conv\">\n");
    page.push_str("<tr><th>declared</th><th>expected</th><th>observed</th></tr>\n");
    let _ = writeln!(
        page,
        "<tr><td>{}</td><td>{}</td><td{}>{}{}</td></tr>\n</table></div>",
        seconds(declared),
        seconds(conv.expected_seconds),
        if unsafe_ { " class=\"fail\"" } else { "" },
        seconds(observed),
        if unsafe_ { " — above declared" } else { "" }
    );
}

/// The window the percentiles cover, for their caption.
fn percentile_window(pct: &PercentilesDocument) -> String {
    match pct.window_seconds {
        Some(w) => format!(
            "Exact percentiles of what this probe process recorded over the last {} (a sliding window \
             kept in quarters: between {} and {} back); a restart empties them.",
            seconds(Some(w)),
            seconds(Some(w * 0.75)),
            seconds(Some(w))
        ),
        None => "Exact percentiles of what this probe process recorded since it started.".into(),
    }
}

fn render_percentiles(page: &mut String, pct: &PercentilesDocument) {
    let _ = writeln!(page, "<h3>Percentiles</h3>\n<p class=\"note\">{}</p>", esc(&percentile_window(pct)));
    page.push_str("<div class=\"scroll\" tabindex=\"0\"><table class=\"pct\">\n");
    page.push_str("<tr><th>measure</th><th>count</th><th>p50</th><th>p75</th><th>p99</th><th>max</th></tr>\n");
    let phases = &pct.lock_phase_duration_seconds;
    let rows: Vec<(String, &Summary)> = vec![
        (format!("{} hold", Phase::PreLock), &phases.pre_lock),
        (format!("{} hold", Phase::HardDelete), &phases.hard_delete),
        (format!("{} hold", Phase::Write), &phases.write),
        ("read-through latency".into(), &pct.read_through_latency_seconds),
        ("observed convergence".into(), &pct.observed_convergence_seconds),
    ];
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
    page.push_str("</table></div>\n");
}

fn render_cycles(page: &mut String, target: &TargetDocument) {
    let cycles = &target.last_cycles;
    page.push_str("<h3>Last cycles</h3>\n");
    if cycles.is_empty() {
        page.push_str("<p class=\"empty\">No cycles yet.</p>\n");
        return;
    }
    let _ = writeln!(
        page,
        "<p class=\"note\">Newest first; the newest {TIMELINES} with their timeline. Times on a timeline are \
         seconds from the cycle's start.</p>"
    );
    for (i, cycle) in cycles.iter().enumerate() {
        let class = result_class(cycle.result);
        let duration = seconds(Some((cycle.finished_at - cycle.started_at).num_milliseconds() as f64 / 1000.0));
        let id = cycle_id(&target.name, cycle);
        // The newest cycle and any that did not pass are open, so failures show at once.
        let open = i == 0 || class != "ok";
        let _ = writeln!(
            page,
            "<details class=\"cycle {class}\" id=\"{}\"{}>\n<summary><span class=\"badge {class}\">{}</span> \
             <time>{}</time> · {} · resource <code>{}</code> · {} failed{} of {}</summary>",
            esc(&id),
            if open { " open" } else { "" },
            cycle.result.as_str(),
            time(cycle.started_at),
            duration,
            esc(&cycle.resource),
            cycle.failed_assertions,
            match cycle.inconclusive_assertions {
                0 => String::new(),
                n => format!(", {n} inconclusive"),
            },
            cycle.assertions.len()
        );
        for note in &cycle.notes {
            let _ = writeln!(page, "<p class=\"note\">{}</p>", esc(note));
        }
        render_decisions(page, cycle);
        if i < TIMELINES {
            render_timeline(page, &id, cycle, &target.instances);
        }
        render_steps(page, &id, cycle, &target.instances);
        page.push_str("</details>\n");
    }
}

/// One line per check that held operations to a lock: how many it held and how many
/// were inconclusive, with why (`docs/probe.md`, "Decision windows").
fn render_decisions(page: &mut String, cycle: &CycleDocument) {
    if cycle.decisions.is_empty() {
        return;
    }
    page.push_str("<p class=\"note\">Operations held to a lock (decision windows):</p>\n<ul class=\"decisions\">\n");
    for d in &cycle.decisions {
        let why = if d.reasons.is_empty() { String::new() } else { format!(": {}", d.reasons.join("; ")) };
        let _ = writeln!(
            page,
            "<li><code>{}</code> {} held, {} inconclusive{}</li>",
            esc(&d.check),
            d.held,
            d.inconclusive,
            esc(&why)
        );
    }
    page.push_str("</ul>\n");
}

/// The parts of a cycle a reader looks at one by one: the main walk's steps, then the
/// negative and eager checks together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Walk(Phase),
    Checks,
}

impl Step {
    const ALL: [Step; 7] = [
        Step::Walk(Phase::Seed),
        Step::Walk(Phase::PreLock),
        Step::Walk(Phase::HardDelete),
        Step::Walk(Phase::Write),
        Step::Walk(Phase::Swap),
        Step::Walk(Phase::Cleanup),
        Step::Checks,
    ];

    fn of(a: &AssertionDocument) -> Step {
        // Documents of earlier versions carry no check name: their assertions are drawn
        // by phase, like the main walk's.
        if a.check.is_empty() || a.check == "cycle" {
            Step::Walk(a.phase)
        } else {
            Step::Checks
        }
    }

    fn label(self) -> &'static str {
        match self {
            Step::Walk(Phase::Cleanup) => "release",
            Step::Walk(p) => p.as_str(),
            Step::Checks => "other checks",
        }
    }

    /// The palette's chart colour (`s0`..`s6`).
    fn colour(self) -> usize {
        Step::ALL.iter().position(|s| *s == self).unwrap_or(6)
    }
}

/// One `<details>` per step, listing its assertions; a step with a failure is open.
fn render_steps(page: &mut String, cycle_id: &str, cycle: &CycleDocument, instances: &[String]) {
    if cycle.assertions.is_empty() {
        page.push_str("<p class=\"empty\">No assertions recorded.</p>\n");
        return;
    }
    for step in Step::ALL {
        let rows: Vec<&AssertionDocument> = cycle.assertions.iter().filter(|a| Step::of(a) == step).collect();
        if rows.is_empty() {
            continue;
        }
        let failed = rows.iter().filter(|a| a.failed()).count();
        let inconclusive = rows.iter().filter(|a| a.inconclusive.is_some()).count();
        let from = rows.iter().map(|a| a.at_seconds - a.duration_seconds).fold(f64::INFINITY, f64::min);
        let to = rows.iter().map(|a| a.at_seconds).fold(0.0_f64, f64::max);
        let mut verdict = if failed > 0 {
            format!("<span class=\"badge fail\">{} failed</span> of {}", failed, rows.len())
        } else {
            format!("<span class=\"badge ok\">passed</span> {} assertions", rows.len())
        };
        if inconclusive > 0 {
            let _ = write!(verdict, ", {inconclusive} inconclusive");
        }
        let _ = writeln!(
            page,
            "<details class=\"step{}\" id=\"{}-{}\"{}>\n<summary>step <strong>{}</strong> {verdict} · {} to {}</summary>",
            if failed > 0 { " fail" } else { "" },
            esc(cycle_id),
            anchor(step.label()),
            if failed > 0 { " open" } else { "" },
            step.label(),
            seconds(Some(from.max(0.0))),
            seconds(Some(to))
        );
        render_assertions(page, &rows, step == Step::Checks, instances);
        page.push_str("</details>\n");
    }
}

/// `i2` for the second instance; the URL when it is not one of the target's.
fn instance_label(instance: Option<&str>, instances: &[String]) -> String {
    match instance {
        None => "—".into(),
        Some(url) => match instances.iter().position(|i| i.trim_end_matches('/') == url.trim_end_matches('/')) {
            Some(i) => format!("i{}", i + 1),
            None => url.to_string(),
        },
    }
}

fn render_assertions(page: &mut String, assertions: &[&AssertionDocument], with_check: bool, instances: &[String]) {
    page.push_str("<div class=\"scroll\" tabindex=\"0\"><table class=\"assertions\">\n<tr><th>assertion</th>");
    if with_check {
        page.push_str("<th>check</th>");
    }
    page.push_str(
        "<th>phase</th><th>op</th><th>instance</th><th>expected</th><th>observed</th><th>at</th>\
         <th>took</th><th>detail</th></tr>\n",
    );
    for a in assertions {
        let (class, mark) = match (a.passed, &a.inconclusive) {
            (_, Some(_)) => ("inconclusive", "? "),
            (true, None) => ("pass", ""),
            (false, None) => ("fail", "✕ "),
        };
        let _ = write!(page, "<tr class=\"{class}\"><td>{mark}{}</td>", esc(&a.name));
        if with_check {
            let _ = write!(page, "<td>{}</td>", esc(&a.check));
        }
        let _ = writeln!(
            page,
            "<td>{}</td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"detail\">{}</td></tr>",
            a.phase,
            a.op,
            esc(a.instance.as_deref().unwrap_or("")),
            esc(&instance_label(a.instance.as_deref(), instances)),
            esc(a.expected.as_str()),
            esc(a.observed.as_str()),
            seconds(Some(a.at_seconds)),
            seconds(Some(a.duration_seconds)),
            esc(&detail_of(a))
        );
    }
    page.push_str("</table></div>\n");
}

/// An assertion's detail, with why it was not judged when it was inconclusive.
fn detail_of(a: &AssertionDocument) -> String {
    match (&a.detail, &a.inconclusive) {
        (Some(d), Some(why)) => format!("{d}; not judged: {why}"),
        (None, Some(why)) => format!("not judged: {why}"),
        (d, None) => d.clone().unwrap_or_default(),
    }
}

/// An ✕ centred on (`cx`, `cy`), `r` from the centre to a tip.
fn cross_path(class: &str, cx: f64, cy: f64, r: f64) -> String {
    let w = r * 0.35;
    let p = |dx: f64, dy: f64| format!("{},{}", num(cx + dx), num(cy + dy));
    format!(
        "<polygon class=\"{class}\" points=\"{} {} {} {} {} {} {} {} {} {} {} {}\"/>",
        p(-r, -r + w),
        p(-r + w, -r),
        p(0.0, -w),
        p(r - w, -r),
        p(r, -r + w),
        p(w, 0.0),
        p(r, r - w),
        p(r - w, r),
        p(0.0, w),
        p(-r + w, r),
        p(-r, r - w),
        p(-w, 0.0)
    )
}

/// Geometry of a timeline: a label column, then the time axis.
struct Frame {
    duration: f64,
}

const WIDTH: f64 = 640.0;
const LABELS: f64 = 88.0;
const RIGHT: f64 = 14.0;
const LANE: f64 = 24.0;
const TOP: f64 = 6.0;

impl Frame {
    fn x(&self, t: f64) -> f64 {
        LABELS + (WIDTH - LABELS - RIGHT) * (t.clamp(0.0, self.duration) / self.duration)
    }
}

/// The lanes of a timeline, top to bottom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Step(Step),
    /// When each instance showed the pre-lock.
    Seen,
}

const LANES: [Lane; 8] = [
    Lane::Step(Step::Walk(Phase::Seed)),
    Lane::Step(Step::Walk(Phase::PreLock)),
    Lane::Seen,
    Lane::Step(Step::Walk(Phase::HardDelete)),
    Lane::Step(Step::Walk(Phase::Write)),
    Lane::Step(Step::Walk(Phase::Swap)),
    Lane::Step(Step::Walk(Phase::Cleanup)),
    Lane::Step(Step::Checks),
];

/// The cycle as an inline SVG: one lane per step with its bar and its assertions' ticks,
/// a lane for the instances showing the pre-lock and a time axis; each failure a cross
/// with its number, named in the list below the chart (as text that wraps on a phone,
/// where the chart's own text is small). Its `<title>` and `<desc>` say it in words.
fn render_timeline(page: &mut String, id: &str, cycle: &CycleDocument, instances: &[String]) {
    let tl = &cycle.timeline;
    let latest = cycle.assertions.iter().map(|a| a.at_seconds).fold(tl.duration_seconds, f64::max);
    let frame = Frame { duration: latest.max(0.001) };
    let walk = &tl.walk;
    let walk_end = walk.ended_seconds.unwrap_or(frame.duration);
    let start_of = |p: Phase| walk.steps.iter().find(|s| s.phase == p).map(|s| s.at_seconds);
    let pre_lock_at = start_of(Phase::PreLock);
    let failures: Vec<&AssertionDocument> = cycle.assertions.iter().filter(|a| a.failed()).collect();
    let axis_y = TOP + LANE * LANES.len() as f64 + 4.0;
    let height = axis_y + 20.0;

    let mut desc = Vec::new();
    let mut svg = String::new();
    // Grid and axis.
    for t in html::axis_ticks(frame.duration, 6) {
        let x = num(frame.x(t));
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
             <text class=\"axis\" x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            num(TOP),
            num(axis_y),
            num(axis_y + 13.0),
            axis_label(t)
        );
    }
    let _ = write!(
        svg,
        "<line class=\"axisline\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
        num(LABELS),
        num(axis_y),
        num(WIDTH - RIGHT),
        num(axis_y)
    );

    for (row, lane) in LANES.iter().enumerate() {
        let top = TOP + LANE * row as f64;
        let label = match lane {
            Lane::Step(step) => step.label(),
            Lane::Seen => "lock seen",
        };
        let _ = write!(svg, "<text x=\"4\" y=\"{}\">{label}</text>", num(top + 14.0));
        match lane {
            Lane::Step(step) => {
                if let Some((from, to)) = step_span(*step, walk, walk_end, frame.duration, cycle) {
                    let _ = write!(
                        svg,
                        "<rect class=\"s{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"10\" rx=\"2\"><title>{label}: {} to {}</title></rect>",
                        step.colour(),
                        num(frame.x(from)),
                        num(top + 3.0),
                        num((frame.x(to) - frame.x(from)).max(2.0)),
                        seconds(Some(from)),
                        seconds(Some(to))
                    );
                    desc.push(format!("{label} from {} to {}", seconds(Some(from)), seconds(Some(to))));
                }
                if *step == Step::Walk(Phase::PreLock) {
                    if let Some(at) = pre_lock_at {
                        pre_lock_marks(
                            &mut svg,
                            &mut desc,
                            &frame,
                            top,
                            at,
                            tl.declared_seconds,
                            walk.escalation_wait_seconds,
                        );
                    }
                }
            }
            Lane::Seen => {
                if let Some(at) = pre_lock_at {
                    seen_marks(&mut svg, &mut desc, &frame, top, at, &tl.convergence, instances);
                }
            }
        }
        // Ticks: passed below the bar, failures as numbered crosses.
        if let Lane::Step(step) = lane {
            for a in cycle.assertions.iter().filter(|a| a.passed && Step::of(a) == *step) {
                let x = num(frame.x(a.at_seconds));
                let _ = write!(
                    svg,
                    "<line class=\"tick-pass\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>",
                    num(top + 15.0),
                    num(top + 21.0)
                );
            }
            // Failures close in time would print their numbers on one another: each
            // number starts where the last one on the lane ended.
            let mut free_from = 0.0_f64;
            for (n, a) in failures.iter().enumerate().filter(|(_, a)| Step::of(a) == *step) {
                let x = frame.x(a.at_seconds);
                let label_x = (x + 7.0).max(free_from);
                let number = (n + 1).to_string();
                free_from = label_x + 7.5 * number.len() as f64 + 3.0;
                let _ = write!(
                    svg,
                    "<g><title>{}</title>{}<text class=\"fail\" x=\"{}\" y=\"{}\">{number}</text></g>",
                    esc(&failure_text(a, instances)),
                    cross_path("failed", x, top + 17.0, 5.0),
                    num(label_x),
                    num(top + 21.0)
                );
            }
        }
    }

    if !failures.is_empty() {
        desc.push(format!(
            "{} failed: {}",
            failures.len(),
            failures.iter().map(|a| failure_text(a, instances)).collect::<Vec<_>>().join("; ")
        ));
    }

    let _ = writeln!(
        page,
        "<div class=\"scroll\" tabindex=\"0\"><svg class=\"chart timeline\" viewBox=\"0 0 {} {}\" role=\"img\" aria-labelledby=\"{id}-title {id}-desc\">\
         <title id=\"{id}-title\">Timeline of the cycle started {}: {}, {} assertions</title>\
         <desc id=\"{id}-desc\">{}</desc>{svg}</svg></div>",
        num(WIDTH),
        num(height),
        time(cycle.started_at),
        cycle.result.as_str(),
        cycle.assertions.len(),
        esc(&desc.join("; ")),
        id = esc(id)
    );
    if !failures.is_empty() {
        page.push_str("<ol class=\"failures\" aria-label=\"Failures, numbered as on the timeline\">\n");
        for a in &failures {
            let _ = writeln!(page, "<li>{}</li>", esc(&failure_text(a, instances)));
        }
        page.push_str("</ol>\n");
    }
}

/// An axis label: `0`, `250 ms`, `2.5 s`.
fn axis_label(t: f64) -> String {
    if t == 0.0 {
        "0".into()
    } else if t < 1.0 {
        format!("{} ms", num(t * 1000.0))
    } else {
        format!("{} s", num(t))
    }
}

/// What a failure was, in one line: phase, operation, instance, expected and observed.
fn failure_text(a: &AssertionDocument, instances: &[String]) -> String {
    let check = if a.check.is_empty() || a.check == "cycle" { String::new() } else { format!(" [{}]", a.check) };
    format!(
        "{} · {} @ {}{check}: expected {}, observed {} at {}",
        a.phase,
        a.op,
        instance_label(a.instance.as_deref(), instances),
        a.expected.as_str(),
        a.observed.as_str(),
        seconds(Some(a.at_seconds))
    )
}

/// When a step ran: a walk step from its start to the next step's (or the walk's end);
/// the other checks from their first assertion to their last. `None` when it did not run.
fn step_span(
    step: Step,
    walk: &crate::probe::checks::report::WalkTimeline,
    walk_end: f64,
    duration: f64,
    cycle: &CycleDocument,
) -> Option<(f64, f64)> {
    match step {
        Step::Walk(phase) => {
            let i = walk.steps.iter().position(|s| s.phase == phase)?;
            let from = walk.steps[i].at_seconds;
            let to = walk.steps.get(i + 1).map_or(walk_end, |s| s.at_seconds);
            Some((from, to.max(from)))
        }
        Step::Checks => {
            let mut times = cycle
                .assertions
                .iter()
                .filter(|a| Step::of(a) == Step::Checks)
                .map(|a| (a.at_seconds - a.duration_seconds, a.at_seconds));
            let first = times.next()?;
            let (from, to) = times.fold(first, |(f, t), (a, b)| (f.min(a), t.max(b)));
            Some((from.max(0.0), to.min(duration)))
        }
    }
}

/// On the preLock lane: the declared delay's end (a dashed line) and the buffer the probe
/// waited on top of it (a dashed box), counted from the pre-lock's answer.
fn pre_lock_marks(
    svg: &mut String,
    desc: &mut Vec<String>,
    frame: &Frame,
    top: f64,
    at: f64,
    declared: Option<f64>,
    wait: Option<f64>,
) {
    if let (Some(declared), Some(wait)) = (declared, wait) {
        if wait > declared {
            let _ = write!(
                svg,
                "<rect class=\"buffer\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"10\"><title>buffer: waited {} after the pre-lock in all</title></rect>",
                num(frame.x(at + declared)),
                num(top + 3.0),
                num((frame.x(at + wait) - frame.x(at + declared)).max(1.0)),
                seconds(Some(wait))
            );
        }
        desc.push(format!("waited {} after the pre-lock before escalating", seconds(Some(wait))));
    }
    if let Some(declared) = declared {
        let x = num(frame.x(at + declared));
        let _ = write!(
            svg,
            "<g><title>declared convergence delay {}</title><line class=\"refline\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
             <text class=\"ref\" x=\"{x}\" y=\"{}\" text-anchor=\"middle\">declared</text></g>",
            seconds(Some(declared)),
            num(top),
            num(top + LANE * 2.0),
            num(top + LANE * 2.0 + 8.0)
        );
        desc.push(format!("declared convergence delay {}", seconds(Some(declared))));
    }
}

/// On the "lock seen" lane: a diamond where each instance showed the pre-lock, a cross
/// where the probe stopped watching one that never did.
fn seen_marks(
    svg: &mut String,
    desc: &mut Vec<String>,
    frame: &Frame,
    top: f64,
    at: f64,
    seen: &[super::status::InstanceSeen],
    instances: &[String],
) {
    for s in seen {
        let label = instance_label(Some(&s.instance), instances);
        let cy = top + 8.0;
        match s.visible_after_seconds {
            Some(after) => {
                let cx = frame.x(at + after);
                let _ = write!(
                    svg,
                    "<g><title>{} showed the lock after {}</title><polygon class=\"pass\" points=\"{},{} {},{} {},{} {},{}\"/>\
                     <text x=\"{}\" y=\"{}\">{}</text></g>",
                    esc(&label),
                    seconds(Some(after)),
                    num(cx),
                    num(cy - 6.0),
                    num(cx + 6.0),
                    num(cy),
                    num(cx),
                    num(cy + 6.0),
                    num(cx - 6.0),
                    num(cy),
                    num(cx + 8.0),
                    num(cy + 4.0),
                    esc(&label)
                );
                desc.push(format!("{label} showed the lock after {}", seconds(Some(after))));
            }
            None => {
                let cx = frame.x(at + s.bound_seconds);
                let _ = write!(
                    svg,
                    "<g><title>{} did not show the lock within {}</title>{}<text class=\"fail\" x=\"{}\" y=\"{}\">{} never</text></g>",
                    esc(&label),
                    seconds(Some(s.bound_seconds)),
                    cross_path("failed", cx, cy, 5.0),
                    num(cx + 8.0),
                    num(cy + 4.0),
                    esc(&label)
                );
                desc.push(format!("{label} did not show the lock within {}", seconds(Some(s.bound_seconds))));
            }
        }
    }
}

fn result_class(result: CycleResult) -> &'static str {
    match result {
        CycleResult::Passed => "ok",
        CycleResult::Failed => "fail",
        CycleResult::Error => "bad",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The document a JSON body of the status API reads as.
    fn doc(json: Value) -> StatusDocument {
        serde_json::from_value(json).unwrap()
    }

    fn assertion(check: &str, phase: &str, op: &str, expected: &str, observed: &str, at: f64) -> Value {
        json!({
            "name": format!("{phase}/{op}"), "check": check, "phase": phase, "op": op,
            "instance": "http://127.0.0.1:8080", "expected": expected, "observed": observed,
            "passed": expected == observed, "durationSeconds": 0.004, "atSeconds": at, "detail": null
        })
    }

    fn cycle(started: &str, finished: &str, result: &str, resource: &str, assertions: Vec<Value>) -> Value {
        let failed = assertions.iter().filter(|a| a["passed"] == false).count();
        json!({
            "startedAt": started, "finishedAt": finished, "result": result, "resource": resource,
            "assertions": assertions, "failedAssertions": failed, "notes": [],
            "timeline": {
                "durationSeconds": 10.0,
                "steps": [
                    { "phase": "seed", "atSeconds": 0.1 }, { "phase": "preLock", "atSeconds": 1.0 },
                    { "phase": "hardDelete", "atSeconds": 4.0 }, { "phase": "write", "atSeconds": 5.0 },
                    { "phase": "swap", "atSeconds": 6.0 }
                ],
                "endedSeconds": 7.0, "escalationWaitSeconds": 2.5, "declaredSeconds": 1.5,
                "convergence": [
                    { "instance": "http://127.0.0.1:8080", "visibleAfterSeconds": 0.4, "boundSeconds": 2.5 },
                    { "instance": "http://127.0.0.1:8081", "visibleAfterSeconds": null, "boundSeconds": 2.5 }
                ]
            },
            "phaseHoldSeconds": { "preLock": 3.1, "hardDelete": 1.0, "write": 1.2 },
            "readThroughP99Seconds": 0.004, "readThroughReads": 2
        })
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
                    "observedConvergenceSeconds": { "count": 4, "p50": 0.9, "p75": 1.0, "p99": 1.2, "max": 1.2 },
                    "windowSeconds": 86400.0
                },
                "lastCycles": [cycle(
                    "2026-11-29T22:39:40Z", "2026-11-29T22:39:50Z", "passed", "probe-0003",
                    vec![assertion("cycle", "hardDelete", "delete", "tombstone", "tombstone", 4.5)]
                )]
            }]
        })
    }

    fn failing() -> Value {
        let mut status = sample();
        let t = &mut status["targets"][0];
        t["lastSuccessAt"] = Value::Null;
        t["missedSchedules"] = json!(2);
        let mut failed = cycle(
            "2026-11-29T22:39:55Z",
            "2026-11-29T22:39:58.5Z",
            "failed",
            "probe-0004",
            vec![
                assertion("cycle", "write", "write", "block", "allow", 5.3),
                assertion("cycle", "write", "read", "allow", "allow", 5.2),
                assertion("wrong-token", "preLock", "renew", "409 token-mismatch", "409 token-mismatch", 7.5),
            ],
        );
        failed["assertions"][0]["detail"] = json!("PUT returned 200, expected 423");
        let passed = t["lastCycles"][0].clone();
        t["lastCycles"] = json!([failed, passed]);
        status
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
        // The cycle, its duration and its assertion, in the step it belongs to.
        assert!(html.contains(
            "<time>2026-11-29T22:39:40Z</time> · 10.00 s · resource <code>probe-0003</code> · 0 failed of 1"
        ));
        assert!(html.contains("<tr class=\"pass\"><td>hardDelete/delete</td><td>hardDelete</td><td>delete</td>"));
        assert!(html.contains("step <strong>hardDelete</strong> <span class=\"badge ok\">passed</span> 1 assertions"));
        // Percentiles in human units, with the window they cover; empty renders as dashes.
        assert!(html.contains(
            "<th scope=\"row\">preLock hold</th><td>2</td><td>3.10 s</td><td>3.20 s</td><td>3.30 s</td><td>3.30 s</td>"
        ));
        assert!(html.contains("<th scope=\"row\">write hold</th><td>0</td><td>—</td><td>—</td><td>—</td><td>—</td>"));
        assert!(html.contains("<th scope=\"row\">read-through latency</th><td>40</td><td>1.0 ms</td><td>2.0 ms</td><td>4.0 ms</td><td>5.0 ms</td>"));
        assert!(html.contains("recorded over the last 24h 00m (a sliding window kept in quarters: between 18h 00m and 24h 00m back); a restart empties them."), "{html}");
        // Convergence within the declared delay is not flagged.
        assert!(html.contains("<td>3.00 s</td><td>3.00 s</td><td>1.20 s</td>"));
        assert!(!html.contains("above declared"));
        // Works without the script: a meta refresh for browsers without it, a link for all.
        assert!(html.contains("<noscript><meta http-equiv=\"refresh\""));
        assert!(html.contains("class=\"refresh\">Refresh</a>"));
        // The newest cycle is open even when it passed.
        assert!(html.contains("<details class=\"cycle ok\" id=\"cycle-demo-1795991980-probe-0003\" open>"), "{html}");
    }

    #[test]
    fn draws_the_cycle_as_a_timeline_with_bars_marks_and_ticks() {
        let html = render(&doc(sample()));
        assert_eq!(html.matches("<svg class=\"chart timeline\"").count(), 1);
        // One bar per step of the walk that ran: seed 0.1..1, preLock 1..4, hardDelete
        // 4..5, write 5..6, swap 6..7 (the walk's end); x = 88 + 538 * t / 10.
        assert!(html.contains("<rect class=\"s0\" x=\"93.38\" y=\"9\" width=\"48.42\" height=\"10\" rx=\"2\"><title>seed: 100.0 ms to 1.00 s</title>"), "{html}");
        assert!(html.contains("<rect class=\"s1\" x=\"141.8\""), "{html}");
        assert!(html.contains("<title>write: 5.00 s to 6.00 s</title>"));
        assert!(html.contains("<title>swap: 6.00 s to 7.00 s</title>"));
        // No release bar: the walk released nothing (the swap cleared the lock).
        assert!(!html.contains("<title>release:"));
        // The declared delay (1 + 1.5 s) and the buffer up to the wait (1 + 2.5 s).
        assert!(
            html.contains("<title>declared convergence delay 1.50 s</title><line class=\"refline\" x1=\"222.5\""),
            "{html}"
        );
        assert!(html.contains("<rect class=\"buffer\" x=\"222.5\""), "{html}");
        // Instance 1 showed the lock after 0.4 s; instance 2 never did.
        assert!(html.contains("<title>i1 showed the lock after 400.0 ms</title>"));
        assert!(html.contains("<title>i2 did not show the lock within 2.50 s</title>"));
        // The assertion's tick at 4.5 s on the hardDelete lane.
        assert!(html.contains("<line class=\"tick-pass\" x1=\"330.1\""), "{html}");
        // A text alternative.
        assert!(html.contains("role=\"img\" aria-labelledby=\"cycle-demo-1795991980-probe-0003-title cycle-demo-1795991980-probe-0003-desc\""));
        assert!(html.contains("seed from 100.0 ms to 1.00 s; preLock from 1.00 s to 4.00 s"), "{html}");
    }

    #[test]
    fn history_names_its_window_and_links_each_cycle() {
        let html = render(&doc(failing()));
        assert!(
            html.contains("<p class=\"note\">Over the last 2 cycles, started 22:39:40 to 22:39:55 UTC.</p>"),
            "{html}"
        );
        // Oldest first: the passed circle, then the failed cross, each a link to its cycle.
        let strip = &html[html.find("chart strip").unwrap()..];
        let (pass, fail) =
            (strip.find("<circle class=\"pass\"").unwrap(), strip.find("<polygon class=\"failed\"").unwrap());
        assert!(pass < fail, "{strip}");
        assert!(strip.contains(
            "<a href=\"#cycle-demo-1795991995-probe-0004\"><title>2026-11-29T22:39:55Z failed: 1 failed of 3</title>"
        ));
        assert!(html.contains("aria-label=\"Results of the last 2 cycles, started 22:39:40 to 22:39:55 UTC: 1 passed, 1 failed, 0 error\""));
        // Sparklines of the holds and the read-through p99, over the same cycles.
        assert!(html.contains("<title>write hold per cycle</title><desc>the last 2 cycles, started 22:39:40 to 22:39:55 UTC: 1.20 s, 1.20 s</desc>"), "{html}");
        assert!(html.contains("read-through p99 (of up to 2 reads per cycle)"));
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
        c["notes"] = json!([evil]);
        c["timeline"]["convergence"][0]["instance"] = json!(evil);
        let a = &mut c["assertions"][0];
        // Phase, operation and result are enums of the probe's own; outcomes carry what a
        // service said (a problem type) and are escaped like the rest.
        for key in ["name", "instance", "expected", "observed", "detail", "check"] {
            a[key] = json!(evil);
        }
        a["observed"] = json!(format!("{evil}!"));
        let html = render(&doc(status));
        let body = &html[html.find("<main>").unwrap()..html.rfind("<script>").unwrap()];
        assert!(!body.contains("<script"), "unescaped markup in:\n{body}");
        assert!(!body.contains("alert(\"x"), "unescaped quote in:\n{body}");
        assert!(body.contains("&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;"));
        // Exactly one script on the page: the refresh.
        assert_eq!(html.matches("<script").count(), 1);
        // Ids are derived from the name and resource without markup characters.
        assert!(html.contains("id=\"target-_script_alert__x_y____script__\""));
        assert!(html.contains("id=\"cycle-_script_alert__x_y____script__-1795991980-_script_alert__x_y____script__\""));
    }

    /// The header says whether what is probed holds, not only that the process runs:
    /// "ready" above a failing target or one without a cycle yet is not the whole story.
    #[test]
    fn the_header_shows_the_worst_target() {
        let html = render(&doc(sample()));
        assert!(html.contains("badge ok\">ready</span> <span class=\"badge ok\">target passing<"), "{html}");
        let html = render(&doc(failing()));
        assert!(html.contains("badge ok\">ready</span> <span class=\"badge fail\">1 of 1 target failing"), "{html}");
        let mut waiting = sample();
        let second = {
            let mut t = waiting["targets"][0].clone();
            t["name"] = json!("new");
            t["lastSuccessAt"] = Value::Null;
            t["lastCycles"] = json!([]);
            t
        };
        waiting["targets"].as_array_mut().unwrap().push(second);
        let html = render(&doc(waiting));
        assert!(html.contains("<span class=\"badge pending\">1 target without a cycle yet"), "{html}");
    }

    /// Each target shows its schedule, with its last and next firing.
    #[test]
    fn each_target_shows_its_schedule_and_firings() {
        let mut status = sample();
        status["targets"][0]["schedule"] = json!({
            "expression": "0 0 */6 * * *", "intervalSeconds": 21600.0,
            "lastFiringAt": "2026-11-29T18:00:00Z", "nextFiringAt": "2026-11-30T00:00:00Z"
        });
        let html = render(&doc(status.clone()));
        assert!(html.contains("<dt>Schedule</dt><dd><code>0 0 */6 * * *</code> (every 6h 00m)</dd>"), "{html}");
        assert!(html.contains("<dt>Last firing</dt><dd><time>2026-11-29T18:00:00Z</time> (4h 40m ago)</dd>"), "{html}");
        assert!(html.contains("<dt>Next firing</dt><dd><time>2026-11-30T00:00:00Z</time> (in 1h 20m)</dd>"), "{html}");
        status["targets"][0]["schedule"]["nextFiringAt"] = Value::Null;
        status["targets"][0]["schedule"]["lastFiringAt"] = Value::Null;
        let html = render(&doc(status));
        assert!(html.contains("<dt>Last firing</dt><dd>none yet</dd>"), "{html}");
        assert!(html.contains("none: the schedule has no further firing"), "{html}");
    }

    #[test]
    fn renders_empty_targets_and_not_ready() {
        let html = render(&doc(json!({ "generatedAt": "2026-11-29T22:40:00Z", "ready": false, "targets": [] })));
        assert!(html.contains("No targets configured."));
        assert!(html.contains("badge bad\">not ready"));
        assert!(!html.contains("<section"));
    }

    #[test]
    fn labels_a_failed_step_and_its_failure_on_the_timeline() {
        let html = render(&doc(failing()));
        assert!(html.contains("<details class=\"cycle fail\" id=\"cycle-demo-1795991995-probe-0004\" open>"), "{html}");
        assert!(html.contains("<span class=\"badge fail\">failed</span>"));
        assert!(html.contains("3.50 s · resource <code>probe-0004</code> · 1 failed of 3"));
        // The failed step is open and says so; the step that passed is closed.
        assert!(html.contains("<details class=\"step fail\" id=\"cycle-demo-1795991995-probe-0004-write\" open>\n<summary>step <strong>write</strong> <span class=\"badge fail\">1 failed</span> of 2"), "{html}");
        assert!(
            html.contains("<details class=\"step\" id=\"cycle-demo-1795991995-probe-0004-other_checks\">"),
            "{html}"
        );
        assert!(html.contains("<tr class=\"fail\"><td>✕ write/write</td><td>write</td><td>write</td><td title=\"http://127.0.0.1:8080\">i1</td><td>block</td><td>allow</td><td>5.30 s</td><td>4.0 ms</td><td class=\"detail\">PUT returned 200, expected 423</td></tr>"), "{html}");
        assert!(html.contains("<tr class=\"pass\"><td>write/read</td>"));
        // The negative check's assertion lists its check.
        assert!(html.contains("<td>preLock/renew</td><td>wrong-token</td>"), "{html}");
        // On the timeline: a numbered cross on the write lane, named in words below.
        assert!(html.contains("<g><title>write · write @ i1: expected block, observed allow at 5.30 s</title><polygon class=\"failed\""), "{html}");
        assert!(html.contains("<text class=\"fail\" x=\"380.14\" y=\"123\">1</text>"), "{html}");
        assert!(html.contains(
            "<ol class=\"failures\" aria-label=\"Failures, numbered as on the timeline\">\n<li>write · write @ i1: expected block, observed allow at 5.30 s</li>"
        ));
        assert!(html.contains("<dt>Last success</dt><dd><span class=\"bad\">never</span></dd>"));
        assert!(html.contains("<dd class=\"warn\">2</dd>"));
        // The CSS rule for failed rows exists, so the highlight is visible.
        assert!(html.contains("tr.fail td"));
        // The older, passed cycle stays closed.
        assert!(html.contains("<details class=\"cycle ok\" id=\"cycle-demo-1795991980-probe-0003\">"));
    }

    #[test]
    fn an_inconclusive_operation_is_shown_as_not_judged_with_why_and_the_checks_decisions() {
        let mut undecided = assertion("eager/renewal", "write", "write", "block", "allow", 8.0);
        undecided["passed"] = json!(false);
        undecided["inconclusive"] = json!("the wall clock moved +1.500s against the monotonic clock");
        let mut c = cycle(
            "2026-11-29T22:39:55Z",
            "2026-11-29T22:40:05Z",
            "failed",
            "probe-0004",
            vec![assertion("eager/renewal", "write", "write", "block", "block", 7.0), undecided],
        );
        c["failedAssertions"] = json!(0);
        c["inconclusiveAssertions"] = json!(1);
        c["decisions"] = json!([{ "check": "eager/renewal", "held": 9, "inconclusive": 1,
            "reasons": ["the wall clock moved +1.500s against the monotonic clock"], "retried": 0 }]);
        let mut status = sample();
        status["targets"][0]["lastCycles"] = json!([c]);
        let html = render(&doc(status));
        assert!(html.contains("resource <code>probe-0004</code> · 0 failed, 1 inconclusive of 2"), "{html}");
        assert!(html.contains("<tr class=\"inconclusive\"><td>? write/write</td>"), "{html}");
        assert!(html.contains("not judged: the wall clock moved +1.500s against the monotonic clock"), "{html}");
        assert!(html.contains("<li><code>eager/renewal</code> 9 held, 1 inconclusive: the wall clock moved"), "{html}");
        // Not a failure: no cross on the timeline, no entry in the failures list.
        assert!(!html.contains("<ol class=\"failures\""), "{html}");
        assert!(html.contains("tr.inconclusive td"));
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
        assert!(html.contains("recorded since it started."));
        assert!(!html.contains("<h3>History</h3>"));
    }

    #[test]
    fn a_cycle_document_of_an_earlier_version_still_renders() {
        // No timeline, no check names, no per-cycle holds: drawn from what is there.
        let mut status = sample();
        let c = &mut status["targets"][0]["lastCycles"][0];
        for key in ["timeline", "phaseHoldSeconds", "readThroughP99Seconds", "readThroughReads"] {
            c.as_object_mut().unwrap().remove(key);
        }
        for key in ["check", "atSeconds"] {
            c["assertions"][0].as_object_mut().unwrap().remove(key);
        }
        let html = render(&doc(status));
        assert!(html.contains("step <strong>hardDelete</strong>"));
        assert!(html.contains("<svg class=\"chart timeline\""));
    }
}
