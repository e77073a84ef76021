//! The HTML and SVG both human pages share (the probe's status page at `/` and the
//! monitor's page at `/monitor`): escaping, times and durations for people, the page
//! frame with its palette (light and dark, every pair contrast-checked by a unit test
//! with the WCAG formula), the refresh script, and sparklines.
//!
//! Both pages are one self-contained document each: inline CSS and SVG, no external
//! asset, readable offline and without JavaScript. JavaScript only improves them: when
//! it runs, the page refreshes its `<main>` in place every [`REFRESH_SECONDS`] and keeps
//! the `<details>` a reader opened or closed; when it does not, a `<noscript>` meta
//! refresh reloads the whole page instead (open `<details>` then fall back to what the
//! server opens: failures), and a plain "Refresh" link is always there.
//!
//! At the bottom of the layers: it imports nothing of ours, so the probe and the monitor
//! can both use it without knowing each other.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};

/// Seconds between refreshes (in place with JavaScript, a full reload without).
pub const REFRESH_SECONDS: u32 = 15;

/// Figures from the paper the pages compare production-like values with.
pub mod reference {
    /// The production write lock's median hold, seconds.
    pub const WRITE_HOLD_P50_SECONDS: f64 = 13.0;
    /// The production write lock's 99th percentile hold, seconds.
    pub const WRITE_HOLD_P99_SECONDS: f64 = 19.0;
}

/// HTML-escapes text for element content and double- or single-quoted attributes.
///
/// Five characters cover both contexts; hand-written because it is that small and the
/// crate has no HTML templating dependency to borrow it from.
pub fn esc(s: &str) -> String {
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

/// A time as the status documents show it, in whole seconds (`2026-11-29T22:40:00Z`).
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `now - then` for people (`12.00 s`), `None` when `then` is in the future.
pub fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> Option<String> {
    let secs = (now - then).num_milliseconds() as f64 / 1000.0;
    (secs >= 0.0).then(|| seconds(Some(secs)))
}

/// `at` as a `<time>` with how long ago it was, or how long until it, from `now`:
/// `<time>2026-11-29T22:39:50Z</time> (10.00 s ago)`, `... (in 5.00 s)`.
pub fn time_from_now(now: DateTime<Utc>, at: DateTime<Utc>) -> String {
    let relative = match ago(now, at) {
        Some(a) => format!(" ({a} ago)"),
        None => ago(at, now).map(|a| format!(" (in {a})")).unwrap_or_default(),
    };
    format!("<time>{}</time>{relative}", time(at))
}

/// A duration for humans: µs and ms for routing costs, s for locks in tests, h/m for
/// production leases; "—" when absent.
pub fn seconds(v: Option<f64>) -> String {
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

/// A fragment id from free text: names may hold anything, ids must not hold spaces.
pub fn anchor(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// A number for an SVG attribute: two decimals, no exponent.
pub fn num(v: f64) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Opens a page: the document head (palette, refresh without JavaScript), a header with
/// `heading`, the `meta` line (HTML, already escaped) and `nav` links, then `<main>`.
/// `path` is the page's own path, for the Refresh link.
pub fn open(page: &mut String, title: &str, heading: &str, path: &str, meta: &str, nav: &[(&str, &str)]) {
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str("<meta name=\"color-scheme\" content=\"light dark\">\n");
    // Without JavaScript the page reloads itself; with it, the script refreshes in place.
    let _ = writeln!(page, "<noscript><meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\"></noscript>");
    let _ = writeln!(page, "<title>{}</title>\n<style>", esc(title));
    page.push_str(&css());
    page.push_str("</style>\n</head>\n<body>\n<header>\n");
    let _ = writeln!(page, "<h1>{}</h1>", esc(heading));
    page.push_str("<nav>");
    for (href, label) in nav {
        let _ = write!(page, "<a href=\"{}\">{}</a> ", esc(href), esc(label));
    }
    let _ = writeln!(
        page,
        "<a href=\"{}\" class=\"refresh\">Refresh</a> <span id=\"refreshed\" class=\"quiet\" \
         aria-live=\"polite\"></span></nav>",
        esc(path)
    );
    let _ = writeln!(page, "<p class=\"meta\">{meta}</p>\n</header>\n<main>");
}

/// Closes what [`open`] opened, with the refresh script.
pub fn close(page: &mut String) {
    page.push_str("</main>\n<script>\n");
    page.push_str(&REFRESH_SCRIPT.replace("REFRESH_MS", &(REFRESH_SECONDS * 1000).to_string()));
    page.push_str("</script>\n</body>\n</html>\n");
}

/// Refreshes `<main>` and the header's meta line in place, keeping every `<details>` (by
/// id) as the reader left it; on a failed fetch it says so and tries again later.
const REFRESH_SCRIPT: &str = r#"(function () {
  "use strict";
  var every = REFRESH_MS, note = document.getElementById("refreshed");
  function refresh() {
    fetch(location.href, { cache: "no-store", headers: { Accept: "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html");
        var main = next.querySelector("main"), meta = next.querySelector("header .meta");
        if (!main) { throw new Error("no main"); }
        var open = {};
        document.querySelectorAll("main details[id]").forEach(function (d) { open[d.id] = d.open; });
        main.querySelectorAll("details[id]").forEach(function (d) {
          if (Object.prototype.hasOwnProperty.call(open, d.id)) { d.open = open[d.id]; }
        });
        document.querySelector("main").replaceWith(document.adoptNode(main));
        var old = document.querySelector("header .meta");
        if (meta && old) { old.replaceWith(document.adoptNode(meta)); }
        if (note) { note.textContent = "updated " + new Date().toLocaleTimeString(); }
      })
      .catch(function (e) { if (note) { note.textContent = "refresh failed (" + e.message + "), retrying"; } })
      .then(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
"#;

/// A colour as `#rrggbb`.
pub type Hex = &'static str;

/// The colours of one scheme. Text pairs must reach 4.5:1 and chart marks 3:1 against
/// the card they sit on (WCAG 2.x, 1.4.3 and 1.4.11); `PALETTE_PAIRS` lists every pair
/// the CSS uses and the unit test checks them.
#[derive(Debug, Clone, Copy)]
pub struct Palette {
    /// Body text.
    pub fg: Hex,
    /// Secondary text.
    pub muted: Hex,
    /// Page background (and table headers).
    pub bg: Hex,
    /// Sections.
    pub card: Hex,
    /// Borders (decoration only).
    pub border: Hex,
    /// Page header background.
    pub head_bg: Hex,
    /// Page header text.
    pub head_fg: Hex,
    /// Links in the header.
    pub head_link: Hex,
    /// Links.
    pub link: Hex,
    /// Passed: text on `ok_bg`.
    pub ok_fg: Hex,
    /// Passed: badge background.
    pub ok_bg: Hex,
    /// Failed: text on `fail_bg`.
    pub fail_fg: Hex,
    /// Failed: row and badge background.
    pub fail_bg: Hex,
    /// Warnings, as text on the card.
    pub warn_fg: Hex,
    /// Errors: text on `bad_bg`, and as text on the card.
    pub bad_fg: Hex,
    /// Errors: badge background.
    pub bad_bg: Hex,
    /// Chart marks, each against the card: seed, preLock, hardDelete, write, swap,
    /// release, other checks.
    pub steps: [Hex; 7],
    /// A passed assertion's tick.
    pub pass: Hex,
    /// A failed assertion's cross.
    pub fail: Hex,
    /// Axes and grid labels.
    pub axis: Hex,
    /// Reference lines (declared delay, the paper's figures).
    pub reference: Hex,
}

/// The light scheme.
pub const LIGHT: Palette = Palette {
    fg: "#1b1f24",
    muted: "#57606a",
    bg: "#f6f8fa",
    card: "#ffffff",
    border: "#d0d7de",
    head_bg: "#24292f",
    head_fg: "#ffffff",
    head_link: "#c8e1ff",
    link: "#0550ae",
    ok_fg: "#116329",
    ok_bg: "#dafbe1",
    fail_fg: "#82071e",
    fail_bg: "#ffebe9",
    warn_fg: "#7d4e00",
    bad_fg: "#953800",
    bad_bg: "#fff1e5",
    steps: ["#6e7781", "#0969da", "#8250df", "#bc4c00", "#1a7f37", "#57606a", "#6639ba"],
    pass: "#1a7f37",
    fail: "#cf222e",
    axis: "#57606a",
    reference: "#953800",
};

/// The dark scheme (`prefers-color-scheme: dark`).
pub const DARK: Palette = Palette {
    fg: "#e6edf3",
    muted: "#9198a1",
    bg: "#0d1117",
    card: "#161b22",
    border: "#30363d",
    head_bg: "#010409",
    head_fg: "#f0f6fc",
    head_link: "#79c0ff",
    link: "#58a6ff",
    ok_fg: "#56d364",
    ok_bg: "#0f2e1a",
    fail_fg: "#ffa198",
    fail_bg: "#3c1618",
    warn_fg: "#d29922",
    bad_fg: "#f0883e",
    bad_bg: "#2d1c0e",
    steps: ["#8b949e", "#58a6ff", "#bc8cff", "#f0883e", "#3fb950", "#9198a1", "#d2a8ff"],
    pass: "#3fb950",
    fail: "#ff7b72",
    axis: "#9198a1",
    reference: "#d29922",
};

/// Every (foreground, background, minimum ratio, what) the CSS uses in `p`.
pub fn palette_pairs(p: &Palette) -> Vec<(Hex, Hex, f64, String)> {
    let text = 4.5;
    let mark = 3.0;
    let mut pairs = vec![
        (p.fg, p.bg, text, "text on the page".to_string()),
        (p.fg, p.card, text, "text on a card".into()),
        (p.muted, p.card, text, "muted text on a card".into()),
        (p.muted, p.bg, text, "muted text on a header cell".into()),
        (p.head_fg, p.head_bg, text, "header text".into()),
        (p.head_link, p.head_bg, text, "header links".into()),
        (p.link, p.card, text, "links".into()),
        (p.ok_fg, p.ok_bg, text, "passed badge".into()),
        (p.ok_fg, p.card, text, "passed text".into()),
        (p.fail_fg, p.fail_bg, text, "failed row".into()),
        (p.fail_fg, p.card, text, "failure labels on a card".into()),
        (p.fail_bg, p.fail, text, "failed badge".into()),
        (p.warn_fg, p.card, text, "warning text".into()),
        (p.bad_fg, p.card, text, "error text".into()),
        (p.bad_fg, p.bad_bg, text, "error badge".into()),
        (p.pass, p.card, mark, "passed tick".into()),
        (p.fail, p.card, mark, "failed cross".into()),
        (p.axis, p.card, text, "axis labels".into()),
        (p.reference, p.card, text, "reference labels".into()),
    ];
    for (i, s) in p.steps.iter().enumerate() {
        pairs.push((s, p.card, mark, format!("chart colour {i}")));
    }
    pairs
}

/// The WCAG 2.x contrast ratio of two `#rrggbb` colours (1 to 21).
pub fn contrast_ratio(a: &str, b: &str) -> f64 {
    let (la, lb) = (luminance(a), luminance(b));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

/// Relative luminance of `#rrggbb` (WCAG 2.x definition); 0 for malformed input.
fn luminance(hex: &str) -> f64 {
    let h = hex.trim_start_matches('#');
    let channel = |i: usize| {
        let c = h.get(i..i + 2).and_then(|s| u8::from_str_radix(s, 16).ok()).unwrap_or(0) as f64 / 255.0;
        if c <= 0.04045 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    if h.len() != 6 {
        return 0.0;
    }
    0.2126 * channel(0) + 0.7152 * channel(2) + 0.0722 * channel(4)
}

fn variables(p: &Palette) -> String {
    let mut v = format!(
        "--fg:{};--muted:{};--bg:{};--card:{};--border:{};--head-bg:{};--head-fg:{};--head-link:{};--link:{};\
         --ok-fg:{};--ok-bg:{};--fail-fg:{};--fail-bg:{};--warn-fg:{};--bad-fg:{};--bad-bg:{};\
         --pass:{};--fail:{};--axis:{};--ref:{};",
        p.fg,
        p.muted,
        p.bg,
        p.card,
        p.border,
        p.head_bg,
        p.head_fg,
        p.head_link,
        p.link,
        p.ok_fg,
        p.ok_bg,
        p.fail_fg,
        p.fail_bg,
        p.warn_fg,
        p.bad_fg,
        p.bad_bg,
        p.pass,
        p.fail,
        p.axis,
        p.reference
    );
    for (i, s) in p.steps.iter().enumerate() {
        let _ = write!(v, "--s{i}:{s};");
    }
    v
}

/// The stylesheet both pages use: the light palette, the dark one under
/// `prefers-color-scheme: dark`, and a layout that fits a 390 px wide phone (tables
/// scroll inside their own box, never the page).
pub fn css() -> String {
    format!(
        ":root{{color-scheme:light dark;{}}}\n@media (prefers-color-scheme: dark){{:root{{{}}}}}\n{}",
        variables(&LIGHT),
        variables(&DARK),
        CSS
    )
}

const CSS: &str = "\
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:var(--fg);background:var(--bg);overflow-wrap:anywhere}
header{background:var(--head-bg);color:var(--head-fg);padding:.6em 1em}
header h1{margin:0;font-size:1.3em;display:inline-block;margin-right:.8em}
header nav{display:inline-block}
header a{color:var(--head-link)}
header .quiet{color:var(--head-fg);font-size:.85em}
.meta{margin:.2em 0 0;font-size:.9em}
main{padding:.8em;max-width:72em}
a{color:var(--link)}
section.card{background:var(--card);border:1px solid var(--border);border-radius:6px;padding:.4em .8em .8em;margin-bottom:1em;min-width:0}
h2{margin:.4em 0}
h3{margin:1em 0 .3em;font-size:1em}
h4{margin:.6em 0 .2em;font-size:.95em}
dl.summary{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.2em 1em;margin:.3em 0}
dt{font-weight:600}
dd{margin:0;min-width:0}
.scroll{overflow-x:auto;max-width:100%}
.scroll:focus-visible{outline:2px solid var(--link)}
table{border-collapse:collapse;font-size:.9em;overflow-wrap:normal}
th,td{min-width:2.5em}
td.detail{min-width:14em}
th,td{border:1px solid var(--border);padding:.2em .5em;text-align:left;vertical-align:top}
th{background:var(--bg)}
td{font-variant-numeric:tabular-nums}
tr.fail td,td.fail{background:var(--fail-bg);color:var(--fail-fg);font-weight:600}
tr.inconclusive td{font-style:italic}
details{margin:.3em 0}
details>summary{cursor:pointer}
details.step{margin-left:.6em}
details.step table{margin:.3em 0 .6em}
.badge{display:inline-block;border-radius:1em;padding:0 .6em;font-size:.85em;font-weight:600}
.badge.ok{background:var(--ok-bg);color:var(--ok-fg)}
.badge.fail{background:var(--fail);color:var(--fail-bg)}
.badge.bad{background:var(--bad-bg);color:var(--bad-fg)}
.badge.pending{background:var(--card);color:var(--fg);border:1px solid var(--border)}
.ok{color:var(--ok-fg)}
.fail-mark{color:var(--fail-fg);font-weight:600}
.bad{color:var(--bad-fg);font-weight:600}
.warn{color:var(--warn-fg);font-weight:600}
.empty,.note{color:var(--muted);font-style:italic}
details.cycle.ok,details.cycle.fail,details.cycle.bad{color:var(--fg);font-weight:400}
.note{font-size:.9em}
code{font-size:.9em}
svg.chart{display:block;width:100%;height:auto;max-width:48em;margin:.3em 0}
svg.timeline{min-width:34em}
svg.spark{width:10em;height:2em;vertical-align:middle}
svg text{fill:var(--fg);font-size:12px;font-family:inherit}
svg text.axis{fill:var(--axis);font-size:11px}
svg text.ref{fill:var(--ref);font-size:11px}
svg text.fail{fill:var(--fail-fg);font-weight:600}
svg .grid{stroke:var(--border);stroke-width:1}
svg .axisline{stroke:var(--axis);stroke-width:1}
svg .refline{stroke:var(--ref);stroke-width:1.5;stroke-dasharray:4 3}
svg .tick-pass{stroke:var(--pass);stroke-width:1.5}
svg .tick-fail{stroke:var(--fail);stroke-width:2.5}
svg .dot{fill:var(--fg)}
svg .line{fill:none;stroke:var(--s1);stroke-width:1.5}
svg .pass{fill:var(--pass)}
svg .failed{fill:var(--fail)}
svg .error{fill:var(--bad-fg)}
svg .s0{fill:var(--s0)}svg .s1{fill:var(--s1)}svg .s2{fill:var(--s2)}svg .s3{fill:var(--s3)}
svg .s4{fill:var(--s4)}svg .s5{fill:var(--s5)}svg .s6{fill:var(--s6)}
svg .buffer{fill:var(--card);stroke:var(--s1);stroke-width:1.5;stroke-dasharray:3 2}
ul.legend{list-style:none;padding:0;margin:.2em 0;font-size:.85em;display:flex;flex-wrap:wrap;gap:.2em 1em}
ol.failures{margin:.3em 0;padding-left:1.6em;color:var(--fail-fg)}
";

/// A small line chart of `values` (oldest first; `None` leaves a gap), with its text
/// alternative: `title` names the series and `desc` the window it covers; the values are
/// listed in the description too, for readers who cannot see the line.
pub fn sparkline(values: &[Option<f64>], title: &str, desc: &str) -> String {
    let (w, h, pad) = (120.0, 24.0, 2.0);
    let max = values.iter().flatten().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(2) as f64 - 1.0;
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / n;
    let y = |v: f64| if max > 0.0 { h - pad - (h - 2.0 * pad) * v / max } else { h - pad };
    let listed: Vec<String> = values.iter().map(|v| seconds(*v)).collect();
    let mut svg = format!(
        "<svg class=\"spark\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\"><title>{}</title>\
         <desc>{}: {}</desc>",
        esc(title),
        esc(title),
        esc(desc),
        esc(&listed.join(", "))
    );
    let mut run: Vec<String> = Vec::new();
    let flush = |run: &mut Vec<String>, svg: &mut String| {
        if run.len() > 1 {
            let _ = write!(svg, "<polyline class=\"line\" points=\"{}\"/>", run.join(" "));
        }
        run.clear();
    };
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => run.push(format!("{},{}", num(x(i)), num(y(*v)))),
            None => flush(&mut run, &mut svg),
        }
    }
    flush(&mut run, &mut svg);
    if let Some((i, Some(v))) = values.iter().enumerate().rev().find(|(_, v)| v.is_some()) {
        let _ = write!(svg, "<circle class=\"dot\" cx=\"{}\" cy=\"{}\" r=\"2\"/>", num(x(i)), num(y(*v)));
    }
    svg.push_str("</svg>");
    svg
}

/// Ticks for an axis from 0 to `max`: a round step giving about `want` intervals.
pub fn axis_ticks(max: f64, want: usize) -> Vec<f64> {
    if !(max.is_finite() && max > 0.0) {
        return vec![0.0];
    }
    let raw = max / want.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    (0..).map(|i| i as f64 * step).take_while(|t| *t <= max * 1.0001).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_says_how_long_ago_or_until() {
        let now = DateTime::parse_from_rfc3339("2026-11-29T22:40:00Z").unwrap().to_utc();
        let at = |s: i64| now + chrono::TimeDelta::seconds(s);
        assert_eq!(time_from_now(now, at(-10)), "<time>2026-11-29T22:39:50Z</time> (10.00 s ago)");
        assert_eq!(time_from_now(now, at(5)), "<time>2026-11-29T22:40:05Z</time> (in 5.00 s)");
        assert_eq!(time_from_now(now, now), "<time>2026-11-29T22:40:00Z</time> (0 s ago)");
    }

    #[test]
    fn every_colour_pair_meets_wcag_contrast_in_both_schemes() {
        // The WCAG examples: black on white is 21:1, a colour on itself 1:1.
        assert!((contrast_ratio("#000000", "#ffffff") - 21.0).abs() < 1e-9);
        assert!((contrast_ratio("#777777", "#777777") - 1.0).abs() < 1e-9);
        // #767676 on white is the well-known 4.54:1, the lightest grey that passes AA.
        assert!((contrast_ratio("#767676", "#ffffff") - 4.54).abs() < 0.01);
        let mut low = Vec::new();
        for (scheme, p) in [("light", LIGHT), ("dark", DARK)] {
            for (fg, bg, min, what) in palette_pairs(&p) {
                let ratio = contrast_ratio(fg, bg);
                if ratio < min {
                    low.push(format!("{scheme} {what}: {fg} on {bg} is {ratio:.2}:1, needs {min}:1"));
                }
            }
        }
        assert!(low.is_empty(), "{}", low.join("\n"));
    }

    #[test]
    fn the_css_carries_both_palettes() {
        let css = css();
        assert!(css.contains(&format!("--fg:{}", LIGHT.fg)));
        assert!(css.contains(&format!("@media (prefers-color-scheme: dark){{:root{{--fg:{}", DARK.fg)));
    }

    #[test]
    fn a_page_works_without_script_and_refreshes_in_place_with_it() {
        let mut page = String::new();
        open(&mut page, "t <x>", "h", "/monitor", "generated now", &[("/", "probe")]);
        page.push_str("<details id=\"a\"></details>");
        close(&mut page);
        assert!(page.contains("<noscript><meta http-equiv=\"refresh\" content=\"15\"></noscript>"));
        assert!(page.contains("<a href=\"/monitor\" class=\"refresh\">Refresh</a>"));
        assert!(page.contains("<title>t &lt;x&gt;</title>"));
        assert!(page.contains("var every = 15000"), "{page}");
        assert!(page.contains("d.open = open[d.id]"), "the script keeps open details");
        assert!(page.trim_end().ends_with("</html>"));
    }

    #[test]
    fn sparkline_has_a_text_alternative_and_gaps() {
        let svg = sparkline(&[Some(1.0), None, Some(2.0), Some(3.0)], "write hold", "last 4 cycles");
        assert!(svg.contains("<title>write hold</title>"));
        assert!(svg.contains("<desc>last 4 cycles: 1.00 s, —, 2.00 s, 3.00 s</desc>"), "{svg}");
        // One polyline: the first value stands alone across the gap.
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert!(svg.contains("<circle"));
    }

    #[test]
    fn axis_ticks_are_round() {
        assert_eq!(axis_ticks(10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(axis_ticks(7.3, 4), vec![0.0, 2.0, 4.0, 6.0]);
        assert_eq!(axis_ticks(0.0, 4), vec![0.0]);
        assert_eq!(num(1.5), "1.5");
        assert_eq!(num(2.0), "2");
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
