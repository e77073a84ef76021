//! The probe is a black-box client: nothing under `src/probe` may reach into the routing
//! library, the service or the store it judges (shared code paths share bugs).

use std::path::Path;

const FORBIDDEN: [&str; 3] = ["routing", "service", "store"];
const ROOTS: [&str; 3] = ["crate::", "lockprobe::", "super::super::"];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `name` starts with a forbidden module as a whole path segment.
fn names_forbidden(name: &str) -> bool {
    FORBIDDEN.iter().any(|f| {
        name.strip_prefix(f)
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    })
}

/// Every use of a forbidden module in `text`, through any root, including inside a
/// `use crate::{...}` group (at any depth).
fn forbidden_uses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for root in ROOTS {
        for (at, _) in text.match_indices(root) {
            let rest = &text[at + root.len()..];
            if names_forbidden(rest) {
                found.push(format!("{root}{}", &rest[..rest.len().min(20)]));
            }
            let Some(group) = rest.strip_prefix('{') else {
                continue;
            };
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if matches!(c, '{' | ',') {
                    start = i + 1;
                } else if start <= i && names_forbidden(group[start..].trim_start()) {
                    found.push(format!("{root}{{{}", group[start..].trim_start()));
                    start = usize::MAX;
                }
            }
        }
    }
    found
}

#[test]
fn the_scan_finds_direct_and_grouped_uses() {
    assert_eq!(forbidden_uses("use crate::routing::enforce;").len(), 1);
    assert_eq!(forbidden_uses("use crate::{clock, service::Fault};").len(), 1);
    assert_eq!(forbidden_uses("use lockprobe::{metrics::{Metrics}, store};").len(), 1);
    assert!(forbidden_uses("use crate::{clock, probe::report::Assertion};").is_empty());
    assert!(forbidden_uses("use crate::routing_table; // a module of its own").is_empty());
}

#[test]
fn probe_imports_nothing_of_routing_service_or_store() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![root.join("probe.rs")];
    sources(&root.join("probe"), &mut files);
    assert!(files.len() > 5, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let uses = forbidden_uses(&text);
        assert!(
            uses.is_empty(),
            "{} uses {uses:?}: the probe must speak only the HTTP contract",
            file.display()
        );
    }
}
