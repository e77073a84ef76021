//! The layers of the crate, checked on its source: no import runs up.
//!
//! Bottom up (each may use what is listed before it, and nothing after):
//!
//! - **bottom**: `versions`, `clock`, `duration`, `percentiles`, `exposition`, `html` and
//!   `document` import nothing of ours (each only itself) but `versions`, the leaf that
//!   names the build's contract and document formats;
//! - **store** uses the bottom;
//! - **routing** uses the bottom and the store;
//! - **service** uses the bottom, the store and routing;
//! - **monitor** uses the bottom, the store and routing (it reads documents and settles
//!   them with the lifecycle's rules), never the service, the probe or the wiring;
//! - **probe** uses only `versions`, `clock`, `duration`, `percentiles`, `exposition` and `html`: it is a
//!   black-box client of the HTTP contract and imports nothing of the routing library,
//!   the document, the store, the service or the monitor it runs beside (shared code
//!   paths share bugs); inside it, three rooms, bottom up: `checks` (what a cycle
//!   checks), `outputs` (what its results become) and `engine` (what runs cycles), each
//!   using only itself and the rooms before it;
//! - **harness** (runs at scale) uses every layer below the wiring, never the wiring;
//! - **app** (the wiring) may use everything; `main.rs` uses `app`.
//!
//! Service, probe and monitor never import each other or the wiring. The layers that a
//! service links (bottom, store, routing) know no command line: no `clap` in them.
//!
//! Every `crate::`, `super::` and `lockprobe::` path in code is resolved to the module it
//! names (groups `use crate::{a, b::{c, d}}` included, `super` counted from the module the
//! path is written in, inline `mod tests { .. }` included); comments and string literals
//! are not code. A single crate with this test rather than a Cargo workspace: see
//! `docs/architecture.md`.
//!
//! `lockprobe::testing` (the store's fault injector, counter and latency wrapper, exposed
//! for tests and hidden from the API) is used only by the test files named in
//! [`MAY_USE_TESTING`], by `examples/` and `benches/`; no module of the crate outside
//! `lib.rs` uses `crate::testing`.

use std::path::{Path, PathBuf};

/// Where a module sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    /// `versions`, `clock`, `duration`, `percentiles`, `exposition`, `html`, `document`.
    Bottom,
    Store,
    Routing,
    Service,
    Monitor,
    Probe,
    /// Runs at scale: every layer below the wiring, none of it.
    Harness,
    App,
    /// `lib.rs` itself (module declarations only).
    Root,
}

const BOTTOM: [&[&str]; 8] = [
    &["versions"],
    &["clock"],
    &["duration"],
    &["percentiles"],
    &["exposition"],
    &["html"],
    &["listener"],
    &["document"],
];

fn layer_of(module: &[String]) -> Option<Layer> {
    let m: Vec<&str> = module.iter().map(String::as_str).collect();
    if BOTTOM.iter().any(|b| m.starts_with(b)) {
        return Some(Layer::Bottom);
    }
    Some(match m.first().copied() {
        None => Layer::Root,
        Some("store") => Layer::Store,
        Some("routing") => Layer::Routing,
        Some("service") => Layer::Service,
        Some("monitor") => Layer::Monitor,
        Some("probe") => Layer::Probe,
        Some("harness") => Layer::Harness,
        Some("app") => Layer::App,
        Some(_) => return None,
    })
}

/// The bottom module `module` belongs to, e.g. `["document"]`.
fn bottom_unit(module: &[String]) -> Option<&'static [&'static str]> {
    let m: Vec<&str> = module.iter().map(String::as_str).collect();
    BOTTOM.iter().copied().find(|b| m.starts_with(b))
}

/// Why `from` may not use `to`, if it may not.
fn refusal(from: &[String], to: &[String]) -> Option<String> {
    let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
        return Some("a module outside every layer: place it in tests/layering.rs".into());
    };
    use Layer::*;
    let allowed = match lf {
        Bottom => bottom_unit(from) == bottom_unit(to) || bottom_unit(to) == Some(&["versions"][..]),
        Store => matches!(lt, Bottom | Store),
        Routing => matches!(lt, Bottom | Store | Routing),
        Service => matches!(lt, Bottom | Store | Routing | Service),
        Monitor => matches!(lt, Bottom | Store | Routing | Monitor),
        Probe if lt == Probe => return probe_room_refusal(from, to),
        Probe => lt == Bottom && bottom_unit(to) != Some(&["document"][..]),
        Harness => !matches!(lt, App | Root),
        App | Root => true,
    };
    (!allowed).then(|| format!("{lf:?} may not use {lt:?}"))
}

/// The probe's rooms, bottom up.
const PROBE_ROOMS: [&str; 3] = ["checks", "outputs", "engine"];

/// Why a module of the probe may not use another of the probe, if it may not: a room
/// uses only itself and the rooms below it (`probe.rs` itself may use every room).
fn probe_room_refusal(from: &[String], to: &[String]) -> Option<String> {
    let rank = |m: &[String]| m.get(1).and_then(|room| PROBE_ROOMS.iter().position(|r| r == room));
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) if t > f => Some(format!("probe::{} may not use probe::{}", PROBE_ROOMS[f], PROBE_ROOMS[t])),
        (Some(_), None) if to.len() > 1 => Some(format!("{} is in no room of the probe", to.join("::"))),
        _ => None,
    }
}

/// The module path of a source file: `src/probe/scenario/walk.rs` -> `probe::scenario::walk`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    match parts.as_slice() {
        [only] if only == "lib" || only == "main" => Vec::new(),
        _ => parts,
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string literals and char literals blanked out (newlines kept),
/// so only code remains.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !b.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(&ch) => blank(&mut out, ch),
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = b.get(i) {
                    blank(&mut out, ch);
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{7f}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Every path of ours in `code` (already [`code_only`]), resolved to an absolute module
/// path of at most two segments past the root, with the inline module it is written in.
/// `module` is the file's own module path.
fn references(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let ident_at = |i: usize| -> Option<(String, usize)> {
        let mut j = i;
        while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
            j += 1;
        }
        (j > i && !chars[i].is_ascii_digit()).then(|| (chars[i..j].iter().collect(), j))
    };
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let sep_at = |i: usize| -> Option<usize> {
        let i = skip_ws(i);
        (chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':')).then(|| skip_ws(i + 2))
    };

    // Inline modules: (brace depth inside it, name).
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0usize;
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == '}' {
            if inline.last().is_some_and(|(d, _)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        let boundary = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        let Some((word, end)) = boundary.then(|| ident_at(i)).flatten() else {
            i += 1;
            continue;
        };
        if word == "mod" {
            let at = skip_ws(end);
            if let Some((name, after)) = ident_at(at) {
                if chars.get(skip_ws(after)) == Some(&'{') {
                    inline.push((depth + 1, name));
                }
            }
            i = end;
            continue;
        }
        if !matches!(word.as_str(), "crate" | "super" | "lockprobe") {
            i = end;
            continue;
        }
        let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(_, n)| n.clone())).collect();
        let mut base: Vec<String> = match word.as_str() {
            "super" => here[..here.len().saturating_sub(1)].to_vec(),
            _ => Vec::new(),
        };
        let mut at = end;
        // Further `super`s.
        while let Some(next) = sep_at(at) {
            match ident_at(next) {
                Some((w, e)) if w == "super" => {
                    base.pop();
                    at = e;
                }
                _ => break,
            }
        }
        let Some(rest) = sep_at(at) else {
            i = end;
            continue;
        };
        let mut paths = Vec::new();
        expand(&chars, rest, base, &mut paths, &ident_at, &sep_at, &skip_ws);
        found.extend(paths);
        i = rest;
    }
    found
}

/// Expands the path (or `{group}`) starting at `i` after the prefix `base` into `out`.
fn expand(
    chars: &[char],
    i: usize,
    base: Vec<String>,
    out: &mut Vec<Vec<String>>,
    ident_at: &dyn Fn(usize) -> Option<(String, usize)>,
    sep_at: &dyn Fn(usize) -> Option<usize>,
    skip_ws: &dyn Fn(usize) -> usize,
) {
    if chars.get(i) == Some(&'{') {
        let mut j = skip_ws(i + 1);
        loop {
            match chars.get(j) {
                None | Some('}') => return,
                Some(',') => j = skip_ws(j + 1),
                _ => {
                    let end = expand_one(chars, j, base.clone(), out, ident_at, sep_at, skip_ws);
                    if end == j {
                        return;
                    }
                    j = skip_ws(end);
                }
            }
        }
    }
    expand_one(chars, i, base, out, ident_at, sep_at, skip_ws);
}

/// Expands one path item at `i`; returns where it ends.
fn expand_one(
    chars: &[char],
    i: usize,
    mut path: Vec<String>,
    out: &mut Vec<Vec<String>>,
    ident_at: &dyn Fn(usize) -> Option<(String, usize)>,
    sep_at: &dyn Fn(usize) -> Option<usize>,
    skip_ws: &dyn Fn(usize) -> usize,
) -> usize {
    let mut at = i;
    loop {
        if chars.get(at) == Some(&'{') {
            // A nested group: find its end and expand each item.
            let mut depth = 0;
            let mut end = at;
            while end < chars.len() {
                match chars[end] {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                end += 1;
            }
            expand(chars, at, path, out, ident_at, sep_at, skip_ws);
            return end + 1;
        }
        if chars.get(at) == Some(&'*') {
            out.push(path);
            return at + 1;
        }
        let Some((seg, end)) = ident_at(at) else {
            if !path.is_empty() {
                out.push(path);
            }
            return at;
        };
        if seg == "self" {
            out.push(path);
            return end;
        }
        path.push(seg);
        match sep_at(end) {
            Some(next) => at = next,
            None => {
                out.push(path);
                let end = skip_ws(end);
                // `as alias`.
                return match ident_at(end) {
                    Some((w, e)) if w == "as" => ident_at(skip_ws(e)).map_or(e, |(_, e2)| e2),
                    _ => end,
                };
            }
        }
    }
}

/// Keeps the module part of a path: at most the first two segments, fewer when the
/// second is an item (a type or a function) rather than a module.
fn module_part(path: &[String]) -> Vec<String> {
    path.iter().take(2).take_while(|s| s.chars().next().is_some_and(|c| c.is_lowercase())).cloned().collect()
}

struct Violation {
    file: PathBuf,
    path: String,
    why: String,
}

fn violations() -> Vec<Violation> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 40, "{files:?}");
    let mut found = Vec::new();
    for file in files {
        let module = module_of(&src, &file);
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let is_main = file.ends_with("main.rs");
        for path in references(&code, &module) {
            let target = module_part(&path);
            if is_main || target.is_empty() {
                continue;
            }
            if let Some(why) = refusal(&module, &target) {
                found.push(Violation { file: file.clone(), path: path.join("::"), why });
            }
        }
        let knows_no_cli = matches!(layer_of(&module), Some(Layer::Bottom | Layer::Store | Layer::Routing));
        if knows_no_cli && code.contains("clap") {
            found.push(Violation {
                file: file.clone(),
                path: "clap".into(),
                why: "the layers a service links know no command line".into(),
            });
        }
    }
    found
}

/// Every module of the source tree (one a file), by path.
fn source_modules() -> Vec<(PathBuf, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    files.into_iter().filter(|f| !f.ends_with("main.rs")).map(|f| (f.clone(), module_of(&src, &f))).collect()
}

/// The module a path names: the longest of `modules` it starts with.
fn module_named<'m>(path: &[String], modules: &'m [Vec<String>]) -> Option<&'m Vec<String>> {
    modules.iter().filter(|m| !m.is_empty() && path.starts_with(m)).max_by_key(|m| m.len())
}

/// The uses between sibling modules: where a module uses another that is not its
/// ancestor or descendant, the use between the two siblings (subtrees under one parent)
/// they sit in, as `(parent, from, to)`, with a file that makes it. A module using its
/// own children or its parent is how Rust splits one module into files, not a cycle.
fn sibling_uses() -> Vec<(Vec<String>, String, String, PathBuf)> {
    let files = source_modules();
    let modules: Vec<Vec<String>> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut uses = Vec::new();
    for (file, module) in &files {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for path in references(&code, module) {
            let Some(target) = module_named(&path, &modules) else { continue };
            let common = module.iter().zip(target).take_while(|(a, b)| a == b).count();
            if common == module.len() || common == target.len() {
                continue;
            }
            let edge = (module[..common].to_vec(), module[common].clone(), target[common].clone(), file.clone());
            if !uses
                .iter()
                .any(|(p, f, t, _): &(Vec<String>, String, String, PathBuf)| (p, f, t) == (&edge.0, &edge.1, &edge.2))
            {
                uses.push(edge);
            }
        }
    }
    uses
}

/// The cycles among siblings: each a set of sibling modules (under one parent) that use
/// one another, directly or through the others, with the uses that close it.
fn cycles(uses: &[(Vec<String>, String, String, PathBuf)]) -> Vec<String> {
    let mut parents: Vec<&Vec<String>> = uses.iter().map(|(p, ..)| p).collect();
    parents.sort();
    parents.dedup();
    let mut found = Vec::new();
    for parent in parents {
        let edges: Vec<&(Vec<String>, String, String, PathBuf)> = uses.iter().filter(|(p, ..)| p == parent).collect();
        let mut nodes: Vec<&String> = edges.iter().flat_map(|(_, f, t, _)| [f, t]).collect();
        nodes.sort();
        nodes.dedup();
        // Reachability by repeated closure: the graphs are a few dozen nodes at most.
        let reaches = |from: &String, to: &String| {
            let mut seen = vec![from];
            let mut i = 0;
            while i < seen.len() {
                let at = seen[i];
                for (_, f, t, _) in &edges {
                    if f == at && !seen.contains(&t) {
                        seen.push(t);
                    }
                }
                i += 1;
            }
            seen[1..].contains(&to)
        };
        let mut grouped: Vec<Vec<&String>> = Vec::new();
        for n in &nodes {
            if grouped.iter().any(|g| g.contains(n)) {
                continue;
            }
            let group: Vec<&String> =
                nodes.iter().copied().filter(|m| m == n || (reaches(n, m) && reaches(m, n))).collect();
            if group.len() > 1 {
                grouped.push(group);
            }
        }
        for group in grouped {
            let closing: Vec<String> = edges
                .iter()
                .filter(|(_, f, t, _)| group.contains(&f) && group.contains(&t))
                .map(|(_, f, t, file)| format!("{f} -> {t} ({})", file.file_name().unwrap().to_string_lossy()))
                .collect();
            let under = if parent.is_empty() { "the crate root".to_owned() } else { parent.join("::") };
            found.push(format!("under {under}: {}", closing.join(", ")));
        }
    }
    found
}

#[test]
fn no_two_sibling_modules_use_each_other() {
    let found = cycles(&sibling_uses());
    assert!(found.is_empty(), "import cycles ({}):\n{}", found.len(), found.join("\n"));
}

#[test]
fn a_planted_cycle_is_found_and_a_parent_child_split_is_not_one() {
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    let edge = |p: &str, f: &str, t: &str| (m(p), f.to_string(), t.to_string(), PathBuf::from(format!("{f}.rs")));
    let uses = vec![edge("probe", "a", "b"), edge("probe", "b", "c"), edge("probe", "c", "a"), edge("probe", "c", "d")];
    let found = cycles(&uses);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("under probe: a -> b (a.rs), b -> c (b.rs), c -> a (c.rs)"), "{found:?}");
    assert!(cycles(&[edge("probe", "a", "b"), edge("probe", "c", "b")]).is_empty());
}

#[test]
fn no_import_runs_up_the_layers() {
    let found = violations();
    let report: Vec<String> = found.iter().map(|v| format!("{}: {} ({})", v.file.display(), v.path, v.why)).collect();
    assert!(report.is_empty(), "imports against the layers:\n{}", report.join("\n"));
}

fn refs(code: &str, module: &[&str]) -> Vec<String> {
    let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
    references(&code_only(code), &module).iter().map(|p| module_part(p).join("::")).collect()
}

#[test]
fn the_scan_resolves_direct_grouped_and_relative_paths() {
    assert_eq!(refs("use crate::routing::enforce;", &["probe"]), ["routing::enforce"]);
    assert_eq!(refs("use crate::{clock, service::Fault};", &["probe"]), ["clock", "service"]);
    assert_eq!(refs("use lockprobe::{probe::{metrics::Metrics}, store};", &[]), ["probe::metrics", "store"]);
    assert_eq!(refs("use super::super::report::Assertion;", &["probe", "scenario", "check"]), ["probe::report"]);
    // `super` inside an inline module counts from that module.
    assert_eq!(refs("mod tests { use super::super::report::X; }", &["probe", "metrics"]), ["probe::report"]);
    assert_eq!(refs("fn f() { crate::store::memory::MemoryStore::new() }", &["app"]), ["store::memory"]);
    // Comments and strings are not code.
    assert!(refs("// use crate::routing;\nlet s = \"crate::store\"; let c = '{';", &["probe"]).is_empty());
    assert_eq!(refs("use crate::routing_table; // a module of its own", &["probe"]), ["routing_table"]);
}

#[test]
fn the_rules_refuse_what_runs_up() {
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    for (from, to) in [
        ("store::memory", "routing::lifecycle"),
        ("store", "app::store"),
        ("routing::client", "service"),
        ("service::lock_api", "monitor"),
        ("monitor", "probe::report"),
        ("monitor", "app"),
        ("probe::scenario", "document"),
        ("probe::target", "store"),
        ("probe", "monitor"),
        ("clock", "duration"),
        ("document", "store"),
        ("probe::checks", "probe::engine"),
        ("probe::checks", "probe::outputs"),
        ("probe::outputs", "probe::engine"),
        ("harness::replay", "app::store"),
        ("service", "harness::load"),
    ] {
        assert!(refusal(&m(from), &m(to)).is_some(), "{from} -> {to} must be refused");
    }
    for (from, to) in [
        ("store::memory", "document"),
        ("monitor", "routing::lifecycle"),
        ("probe::outputs", "percentiles"),
        ("probe::engine", "exposition"),
        ("service", "routing::client"),
        ("app::serve", "monitor"),
        ("routing::client", "store"),
        ("probe::engine", "probe::checks"),
        ("probe::outputs", "probe::checks"),
        ("probe", "probe::engine"),
    ] {
        assert!(refusal(&m(from), &m(to)).is_none(), "{from} -> {to} must be allowed");
    }
}

/// The test files that may use `lockprobe::testing`, relative to the package: the fault,
/// campaign, store and load tests and the support modules they share. `examples/` and
/// `benches/` may use it too. A file added here is a test that needs the crate's
/// insides; a file that stops using it must leave the list.
const MAY_USE_TESTING: &[&str] = &[
    "tests/bench_smoke.rs",
    "tests/fault_campaign.rs",
    "tests/force_release.rs",
    "tests/monitor_run.rs",
    "tests/probe_kill_restart.rs",
    "tests/routing_bugs.rs",
    "tests/routing_client.rs",
    "tests/routing_concurrency.rs",
    "tests/routing_properties.rs",
    "tests/routing_resolve.rs",
    "tests/service_contract.rs",
    "tests/store_fault_scenarios.rs",
    "tests/support/fleet.rs",
    "tests/support/service.rs",
    "tests/support/stores.rs",
];

/// Whether `code` (a whole file) names `testing` at the crate root, through `lockprobe::`
/// or `crate::` (resolved as the layer scan resolves them, `module` being the file's own
/// module path).
fn uses_testing(code: &str, module: &[String]) -> bool {
    references(&code_only(code), module).iter().any(|p| p.first().is_some_and(|s| s == "testing"))
}

/// Every use of `testing` where it may not be, and every file of [`MAY_USE_TESTING`]
/// that no longer uses it (or no longer exists), each as a line to report.
fn testing_misuses() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let src = root.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        if file == src.join("lib.rs") {
            continue;
        }
        if uses_testing(&std::fs::read_to_string(&file).unwrap(), &module_of(&src, &file)) {
            found.push(format!("{}: crate::testing is for the tests, not the crate's modules", file.display()));
        }
    }
    let mut files = Vec::new();
    sources(&root.join("tests"), &mut files);
    assert!(files.len() > 40, "{files:?}");
    let mut users = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if !uses_testing(&std::fs::read_to_string(&file).unwrap(), &[]) {
            continue;
        }
        if !MAY_USE_TESTING.contains(&rel.as_str()) {
            found.push(format!("{rel}: uses lockprobe::testing but is not in MAY_USE_TESTING"));
        }
        users.push(rel);
    }
    for listed in MAY_USE_TESTING {
        if !users.iter().any(|u| u == listed) {
            found.push(format!("{listed}: in MAY_USE_TESTING but does not use lockprobe::testing"));
        }
    }
    found
}

#[test]
fn only_the_named_tests_use_the_testing_module() {
    let found = testing_misuses();
    assert!(found.is_empty(), "uses of lockprobe::testing ({}):\n{}", found.len(), found.join("\n"));
}

#[test]
fn the_testing_scan_sees_direct_grouped_and_crate_uses() {
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    assert!(uses_testing("use lockprobe::testing::FaultyStore;", &[]));
    assert!(uses_testing("use lockprobe::{store, testing::{FaultAction, OpSet}};", &[]));
    assert!(uses_testing("fn f() { lockprobe::testing::in_step(\"x\", g()) }", &[]));
    assert!(uses_testing("use crate::testing::CountingStore;", &m("service::lock_api")));
    assert!(uses_testing("mod t { use super::super::testing::OpSet; }", &m("store")));
    // Comments, strings and look-alikes are not uses.
    assert!(!uses_testing("// lockprobe::testing::FaultyStore\nlet s = \"crate::testing\";", &[]));
    assert!(!uses_testing("use lockprobe::store::testing_helpers;", &[]));
    assert!(!uses_testing("use lockprobe::testing_more::X;", &[]));
}
