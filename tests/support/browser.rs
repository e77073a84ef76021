//! Headless Chromium for the page tests: the DOM as the browser parsed it, screenshots
//! kept as artifacts under the cargo target directory, and a layout and accessibility
//! check at phone width.
//!
//! The layout and accessibility check loads a copy of the served page (byte for byte,
//! plus two script tags: axe-core from `scripts/axe/node_modules` and a runner) inside a
//! 390 px wide frame: headless Chromium will not make its window narrower than 500 px,
//! a frame can be. The runner measures the page's scroll width against its viewport,
//! names any element wider than the viewport, runs axe-core's WCAG 2.1 A and AA rules,
//! and posts what it found to the frame's parent, which the test reads from the DOM.
//! `--force-dark-mode` makes `prefers-color-scheme: dark` match.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where the screenshots and page copies go: under the cargo target directory, never in
/// the repository.
pub fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pages");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

/// The browser, or a failure that says how to get it.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("chromium")).find(|p| p.is_file()));
    found.unwrap_or_else(|| {
        panic!("`chromium` is not installed: run `scripts/install-test-deps.sh` as root (or `bash scripts/test.sh`)")
    })
}

/// axe-core's browser bundle, or a failure that says how to get it.
fn axe_script() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/axe/node_modules/axe-core/axe.min.js");
    assert!(path.is_file(), "{} is missing: run `bash scripts/setup-page-tools.sh`", path.display());
    path
}

/// Runs Chromium headless with `args` on `url`; returns stdout. Fails after a minute.
fn run(args: &[String], url: &str, dark: bool) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if dark {
        cmd.arg("--force-dark-mode");
    }
    let mut child = cmd.spawn().expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium on {url} did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(out.status.success(), "chromium failed on {url}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM of `url` after it loaded, as Chromium serialises it.
pub fn dump_dom(url: &str) -> String {
    let dom = run(&["--dump-dom".into()], url, false);
    assert!(dom.contains("<html"), "chromium printed no DOM for {url}:\n{dom}");
    dom
}

/// The DOM of `url` after `budget_ms` of virtual time (timers run; the page's scripts
/// and fetches are waited for).
pub fn dump_dom_after(url: &str, budget_ms: u32) -> String {
    let dom = run(&["--dump-dom".into(), format!("--virtual-time-budget={budget_ms}")], url, false);
    assert!(dom.contains("<html"), "chromium printed no DOM for {url}:\n{dom}");
    dom
}

/// A full-height screenshot of `url` at `width` CSS pixels, saved as `<name>.png` under
/// [`artifacts`]; returns its path.
pub fn screenshot(url: &str, name: &str, width: u32, height: u32, dark: bool) -> PathBuf {
    let path = artifacts().join(format!("{name}.png"));
    let _ = std::fs::remove_file(&path);
    run(&[format!("--screenshot={}", path.display()), format!("--window-size={width},{height}")], url, dark);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG"), "{} is not a PNG", path.display());
    path
}

/// What the runner found in the 390 px frame.
#[derive(Debug)]
pub struct Inspection {
    /// The document's scroll width, CSS pixels.
    pub scroll_width: f64,
    /// The frame's viewport width, CSS pixels.
    pub client_width: f64,
    /// Elements wider than the viewport (`tag.class#id: right edge`), if any.
    pub too_wide: Vec<String>,
    /// axe-core's violations: `rule (impact): help — first target`.
    pub violations: Vec<String>,
    /// How many axe rules passed (so a runner that checked nothing is noticed).
    pub passes: usize,
    /// Whether `prefers-color-scheme: dark` matched in the frame.
    pub dark: bool,
}

const RUNNER: &str = r##"<script>
window.addEventListener("load", function () {
  var vw = document.documentElement.clientWidth, wide = [];
  document.querySelectorAll("body *").forEach(function (el) {
    var r = el.getBoundingClientRect();
    if (r.right > vw + 0.5 && !el.closest(".scroll")) {
      wide.push(el.tagName.toLowerCase() + "." + (el.getAttribute("class") || "") + "#" + (el.id || "") + ": " + Math.round(r.right));
    }
  });
  axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] } })
    .then(function (res) {
      parent.postMessage(JSON.stringify({
        scrollWidth: document.documentElement.scrollWidth, clientWidth: vw, tooWide: wide.slice(0, 20),
        dark: matchMedia("(prefers-color-scheme: dark)").matches, passes: res.passes.length,
        violations: res.violations.map(function (v) {
          return v.id + " (" + v.impact + "): " + v.help + " — " + v.nodes.length + " nodes, first " +
            JSON.stringify(v.nodes[0].target) + " " + (v.nodes[0].failureSummary || "").replace(/\s+/g, " ");
        })
      }), "*");
    })
    .catch(function (e) { parent.postMessage(JSON.stringify({ error: String(e) }), "*"); });
});
</script>"##;

/// Loads `html` (a page as served) in a 390 px wide frame, light or dark, and reports
/// its layout and axe-core's findings. The copies are kept under [`artifacts`] as
/// `<name>.inspected.html`.
pub fn inspect(html: &str, name: &str, dark: bool) -> Inspection {
    let dir = artifacts();
    let scheme = if dark { "dark" } else { "light" };
    let axe = format!("<script src=\"file://{}\"></script>{RUNNER}", axe_script().display());
    let at = html.rfind("</body>").expect("the page has a </body>");
    let page = format!("{}{axe}{}", &html[..at], &html[at..]);
    let page_path = dir.join(format!("{name}.{scheme}.inspected.html"));
    std::fs::write(&page_path, page).expect("write page copy");
    let frame = format!(
        "<!DOCTYPE html><html><body style=\"margin:0\"><iframe src=\"file://{}\" style=\"width:390px;height:844px;border:0\"></iframe>\
         <pre id=\"result\"></pre><script>addEventListener(\"message\", function (e) {{ document.getElementById(\"result\").textContent = e.data; }});</script></body></html>",
        page_path.display()
    );
    let frame_path = dir.join(format!("{name}.{scheme}.frame.html"));
    std::fs::write(&frame_path, frame).expect("write frame");
    let dom = run(
        &["--dump-dom".into(), "--virtual-time-budget=8000".into(), "--allow-file-access-from-files".into()],
        &format!("file://{}", frame_path.display()),
        dark,
    );
    let start = dom.find("<pre id=\"result\">").map(|i| i + "<pre id=\"result\">".len());
    let text = start.and_then(|s| dom[s..].find("</pre>").map(|e| &dom[s..s + e])).unwrap_or_default();
    let text = text.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("no result from the runner ({e}):\n{dom}"));
    assert!(v.get("error").is_none(), "axe-core failed on {name} ({scheme}): {}", v["error"]);
    let strings = |key: &str| -> Vec<String> {
        v[key].as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
    };
    Inspection {
        scroll_width: v["scrollWidth"].as_f64().unwrap_or(f64::NAN),
        client_width: v["clientWidth"].as_f64().unwrap_or(f64::NAN),
        too_wide: strings("tooWide"),
        violations: strings("violations"),
        passes: v["passes"].as_u64().unwrap_or(0) as usize,
        dark: v["dark"].as_bool().unwrap_or(false),
    }
}

/// Fails unless the page fits 390 px without horizontal scrolling and axe-core found no
/// WCAG 2.1 A/AA violation, in light and in dark mode.
pub fn assert_fits_and_accessible(html: &str, name: &str) {
    // Light and dark side by side: each browser mostly waits on its own start-up.
    let found: Vec<(bool, Inspection)> = std::thread::scope(|scope| {
        let runs: Vec<_> =
            [false, true].map(|dark| scope.spawn(move || (dark, inspect(html, name, dark)))).into_iter().collect();
        runs.into_iter().map(|r| r.join().expect("inspection thread")).collect()
    });
    for (dark, found) in found {
        let scheme = if dark { "dark" } else { "light" };
        assert_eq!(found.dark, dark, "{name}: prefers-color-scheme did not follow --force-dark-mode");
        assert_eq!(found.client_width, 390.0, "{name} ({scheme}): the frame is not 390 px wide: {found:?}");
        assert!(
            found.scroll_width <= found.client_width && found.too_wide.is_empty(),
            "{name} ({scheme}) overflows 390 px horizontally: scroll width {} > {}; too wide: {:#?}",
            found.scroll_width,
            found.client_width,
            found.too_wide
        );
        assert!(found.passes > 10, "{name} ({scheme}): axe-core passed only {} rules: did it run?", found.passes);
        assert!(
            found.violations.is_empty(),
            "{name} ({scheme}): axe-core found WCAG 2.1 A/AA violations:\n{}",
            found.violations.join("\n")
        );
    }
}
