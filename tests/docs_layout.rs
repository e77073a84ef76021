//! The two pictures of the tree, `docs/architecture.md` and the README's layout, stay
//! true: every path and every crate module path they name exists, every top-level module
//! and every folder of `src/` is named, the README names every page of `docs/`, and the
//! `//!` map of `lib.rs` names every top-level module. The other pages of `docs/`,
//! `BENCHMARKS.md` and `RELIABILITY.md` name only paths and module paths that exist.
//!
//! What counts as a named path: a `code span` or a link target. A code span is a path
//! when it is one word of path characters whose first part is a top-level folder of the
//! repository (`src/...`, `tests/...`) or that ends in `.rs`; one that starts elsewhere
//! (`store/counting.rs`, `page.rs`) must be the end of some file's path (in the two
//! pictures of the tree only). A code span is a
//! module path when it starts with a top-level module of the crate and goes on with
//! `::`; every part must be a module (a file) until the first that is not, and that one
//! must be defined or re-exported in the module before it. Code blocks are pictures and
//! are not read.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// The top-level folders a rooted path may start with.
const TOP_FOLDERS: [&str; 11] =
    ["src", "tests", "scripts", "docs", "examples", "benches", "deploy", "dashboards", "alerts", ".ci", ".github"];

/// The text outside fenced code blocks.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every `code span` of the prose.
fn code_spans(prose: &str) -> Vec<String> {
    prose.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Every link target `](target)` of the prose that points inside the repository.
fn link_targets(prose: &str) -> Vec<String> {
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap_or("").to_owned())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

/// Every file of the repository below `dir` that git would keep (no build output, no
/// installed packages, nothing in a hidden folder but `.ci`: `.git`, and `.test-tools`
/// with its tens of thousands of installed files), as paths relative to the root with
/// `/` separators.
fn files_below(dir: &Path, out: &mut Vec<String>) {
    const SKIPPED: [&str; 2] = ["target", "node_modules"];
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let hidden = name.starts_with('.') && name != ".ci";
            if !hidden && !SKIPPED.contains(&name.as_str()) {
                files_below(&path, out);
            }
        } else if let Ok(relative) = path.strip_prefix(root()) {
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The repository's files ([`files_below`] the root), walked once for all the checks.
fn all_files() -> &'static [String] {
    static FILES: OnceLock<Vec<String>> = OnceLock::new();
    FILES.get_or_init(|| {
        let mut files = Vec::new();
        files_below(&root(), &mut files);
        files
    })
}

/// The top-level modules `lib.rs` declares with a file of their own (`pub mod x;`); an
/// inline one (the hidden `pub mod testing { .. }`) has no file or folder to name.
fn top_modules() -> Vec<String> {
    read("src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod ")))
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// The source file of a module path (`["probe", "engine"]` -> `src/probe/engine.rs`).
fn module_file(parts: &[&str]) -> Option<PathBuf> {
    let base = root().join("src").join(parts.join("/"));
    [base.with_extension("rs"), base.join("mod.rs")].into_iter().find(|p| p.is_file())
}

/// Whether `name` is defined in, or re-exported by, the module whose source is `file`
/// (inline `pub mod name { .. }` included).
fn defines(file: &Path, name: &str) -> bool {
    let source = fs::read_to_string(file).unwrap_or_default();
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let tokens = words(&source);
    const INTRODUCERS: [&str; 8] = ["fn", "struct", "enum", "trait", "type", "const", "static", "mod"];
    if tokens.windows(2).any(|w| INTRODUCERS.contains(&w[0].as_str()) && w[1] == name) {
        return true;
    }
    // A `pub use` brings in the last segment of each path it lists (or its `as` name),
    // not the modules the path goes through: `pub use outputs::status_page::render as
    // render_status_page` defines `render_status_page`, not `status_page`.
    source.split("pub use ").skip(1).filter_map(|rest| rest.split(';').next()).any(|list| {
        list.split([',', '{', '}']).any(|leaf| {
            let leaf = leaf.trim();
            let brought = match leaf.rsplit_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => leaf.rsplit("::").next().unwrap_or(leaf).trim(),
            };
            brought == name
        })
    })
}

/// What is wrong with a module path a document names, if anything.
fn check_module_path(span: &str, top: &[String]) -> Option<String> {
    let parts: Vec<&str> = span.split("::").collect();
    if parts.len() < 2 || !top.iter().any(|m| m == parts[0]) {
        return None;
    }
    if !parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')) {
        return None;
    }
    let mut depth = 1;
    while depth < parts.len() && module_file(&parts[..=depth]).is_some() {
        depth += 1;
    }
    if depth == parts.len() {
        return None;
    }
    let file = module_file(&parts[..depth]).expect("the first part is a top-level module");
    (!defines(&file, parts[depth]))
        .then(|| format!("`{span}`: `{}` is neither a module nor defined in {}", parts[depth], file.display()))
}

/// What is wrong with a path a document names, if anything. What an installer makes
/// (`node_modules`) is not the repository's and is not checked.
fn check_path(span: &str, files: &[String]) -> Option<String> {
    if span.is_empty() || !span.chars().all(is_path_char) || span.starts_with('/') || span.contains("..") {
        return None;
    }
    if span.contains("node_modules") {
        return None;
    }
    let first = span.split('/').next().unwrap_or("");
    if TOP_FOLDERS.contains(&first) && span.contains('/') {
        return (!root().join(span.trim_end_matches('/')).exists()).then(|| format!("`{span}` does not exist"));
    }
    if span.ends_with(".rs") {
        let tail = format!("/{span}");
        return (!files.iter().any(|f| f.ends_with(&tail) || f == span))
            .then(|| format!("`{span}` is the end of no file's path"));
    }
    None
}

/// Every problem with the paths and module paths `doc` names. Only the two pictures of
/// the tree name files by their ends (`store/counting.rs`); other pages may name another
/// project's files that way (the Cosmos DB SDK's), so there only rooted paths count.
fn named_but_missing(doc: &str) -> Vec<String> {
    let tree_picture = doc == "README.md" || doc == "docs/architecture.md";
    let text = prose(&read(doc));
    let files = all_files();
    let top = top_modules();
    let folder = root().join(doc).parent().expect("a document in a folder").to_path_buf();
    let mut problems = Vec::new();
    for span in code_spans(&text) {
        let span = span.trim();
        let rooted = TOP_FOLDERS.iter().any(|f| span.starts_with(&format!("{f}/")));
        if tree_picture || rooted {
            problems.extend(check_path(span, files));
        }
        problems.extend(check_module_path(span.trim_end_matches("()"), &top));
    }
    for target in link_targets(&text) {
        if !folder.join(&target).exists() {
            problems.push(format!("the link ({target}) leads nowhere"));
        }
    }
    problems
}

/// Every folder below `src/`, relative to the root.
fn source_folders() -> Vec<String> {
    let mut folders: BTreeSet<String> = BTreeSet::new();
    for file in all_files().iter().filter(|f| f.starts_with("src/") && f.ends_with(".rs")) {
        let mut parent = Path::new(file).parent();
        while let Some(p) = parent.filter(|p| p != &Path::new("src")) {
            folders.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
    }
    folders.into_iter().collect()
}

/// Whether `doc` names the source folder `folder`: by its path, or, when it names the
/// folder above, by its own name (`scenario/`) or its module file's (`store.rs`).
fn names_folder(text: &str, folder: &str) -> bool {
    if text.contains(&format!("`{folder}/`")) {
        return true;
    }
    let path = Path::new(folder);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { return false };
    let name = name.to_string_lossy();
    parent != Path::new("src")
        && names_folder(text, &parent.to_string_lossy())
        && (text.contains(&format!("`{name}/`")) || text.contains(&format!("`{name}.rs`")))
}

#[test]
fn every_path_and_module_the_architecture_page_names_exists() {
    let problems = named_but_missing("docs/architecture.md");
    assert!(problems.is_empty(), "docs/architecture.md names what is not there:\n{}", problems.join("\n"));
}

#[test]
fn every_path_and_module_the_readme_names_exists() {
    let problems = named_but_missing("README.md");
    assert!(problems.is_empty(), "README.md names what is not there:\n{}", problems.join("\n"));
}

#[test]
fn both_pictures_name_every_top_level_module() {
    for doc in ["docs/architecture.md", "README.md"] {
        let text = prose(&read(doc));
        let missing: Vec<String> = top_modules()
            .into_iter()
            .filter(|m| !text.contains(&format!("`src/{m}.rs`")) && !text.contains(&format!("`src/{m}/`")))
            .collect();
        assert!(missing.is_empty(), "{doc} does not name src/<module>.rs or src/<module>/ of {missing:?}");
    }
}

#[test]
fn the_architecture_page_names_every_folder_of_the_source() {
    let text = prose(&read("docs/architecture.md"));
    let folders = source_folders();
    assert!(folders.iter().any(|f| f == "src/probe/engine"), "the walk found the probe's rooms: {folders:?}");
    let missing: Vec<&String> = folders.iter().filter(|f| !names_folder(&text, f)).collect();
    assert!(missing.is_empty(), "docs/architecture.md does not name {missing:?}");
}

#[test]
fn the_readme_names_every_page_of_the_docs() {
    let text = read("README.md");
    let mut missing = Vec::new();
    for entry in fs::read_dir(root().join("docs")).expect("docs/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && !text.contains(&format!("(docs/{name}")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "README.md links no docs/ page {missing:?}");
}

#[test]
fn the_map_in_lib_rs_names_every_top_level_module() {
    let lib = read("src/lib.rs");
    let map: String = lib.lines().filter_map(|l| l.strip_prefix("//!")).collect::<Vec<_>>().join("\n");
    let missing: Vec<String> = top_modules().into_iter().filter(|m| !map.contains(&format!("[`{m}`]"))).collect();
    assert!(missing.is_empty(), "the //! map of lib.rs leaves out {missing:?}");
}

/// The checks find what they are for: a stale path, a module that moved, an item that
/// is not there, a link to nowhere.
#[test]
fn the_checks_catch_a_stale_picture() {
    let files = all_files();
    let top = top_modules();
    assert!(check_path("src/probe/engine/scheduler.rs", files).is_none());
    assert!(check_path("store/counting.rs", files).is_none());
    assert!(check_path("src/probe/scheduler.rs", files).is_some(), "a file that moved");
    assert!(check_path("app/replay.rs", files).is_some(), "a file that moved out of app");
    assert!(check_path("POST /v1/resources/{id}/lock", files).is_none(), "not a path");
    assert!(check_module_path("probe::engine::scheduler::CycleCap", &top).is_none());
    assert!(check_module_path("monitor::MonitorConfig", &top).is_none(), "a re-export");
    assert!(check_module_path("duration::parse_bounded_duration", &top).is_none(), "a function");
    assert!(check_module_path("probe::status_page", &top).is_some(), "a module that moved into a room");
    assert!(check_module_path("probe::engine::scheduler::NoSuchCap", &top).is_some(), "an item that is not there");
    assert!(check_module_path("lifecycle::settle", &top).is_none(), "not rooted at the crate: not checked");
    let text = prose("a [page](nowhere.md) and [one](architecture.md#layers) ```\n```");
    assert_eq!(link_targets(&text), ["nowhere.md", "architecture.md"]);
    assert!(names_folder("`src/probe/` with `checks/`", "src/probe/checks"));
    assert!(!names_folder("`src/probe.rs` and `checks/`", "src/probe/checks"), "the folder above is not named");
}

#[test]
fn every_path_and_module_the_other_pages_name_exists() {
    let mut problems = Vec::new();
    for entry in fs::read_dir(root().join("docs")).expect("docs/").flatten() {
        let name = format!("docs/{}", entry.file_name().to_string_lossy());
        if name.ends_with(".md") && name != "docs/architecture.md" {
            problems.extend(named_but_missing(&name).into_iter().map(|p| format!("{name}: {p}")));
        }
    }
    for page in ["BENCHMARKS.md", "RELIABILITY.md"] {
        problems.extend(named_but_missing(page).into_iter().map(|p| format!("{page}: {p}")));
    }
    assert!(problems.is_empty(), "pages name what is not there:\n{}", problems.join("\n"));
}
