//! The probe is a black-box client: nothing under `src/probe` may reach into the routing
//! library, the service or the store it judges (shared code paths share bugs).

use std::path::Path;

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

#[test]
fn probe_imports_nothing_of_routing_service_or_store() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![root.join("probe.rs")];
    sources(&root.join("probe"), &mut files);
    assert!(files.len() > 5, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for forbidden in ["routing", "service", "store"] {
            for prefix in ["crate::", "lockprobe::", "super::super::"] {
                let needle = format!("{prefix}{forbidden}");
                assert!(
                    !text.contains(&needle),
                    "{} uses {needle}: the probe must speak only the HTTP contract",
                    file.display()
                );
            }
        }
    }
}
