//! What this build speaks and stores, named in one place (docs/contract.md, "Versions";
//! CHANGELOG.md says which revision introduced each): the crate's version, the version
//! of the HTTP contract its service implements, and the document formats
//! (`schemaVersion`) its routing library reads and writes. A leaf every layer may use:
//! `--version`, `lockprobe_build_info` and the document's parser all name the same.

use std::ops::RangeInclusive;
use std::sync::LazyLock;

/// The crate's version (`Cargo.toml`).
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version of the probe contract (`docs/contract.md`) the reference service
/// implements.
pub const CONTRACT_VERSION: &str = "1.4";

/// The newest document format this build writes; it writes the oldest format that
/// says what a document means (`document::LocationDocument::format`).
pub const NEWEST_FORMAT: u64 = 2;

/// The document formats this build reads; a document in any other is refused.
pub const FORMATS_READ: RangeInclusive<u64> = 1..=NEWEST_FORMAT;

/// `FORMATS_READ` as people and metric labels write it, e.g. `1-2`.
pub fn formats_read() -> String {
    format!("{}-{}", FORMATS_READ.start(), FORMATS_READ.end())
}

/// The long version line `lockprobe --version` prints.
pub static VERSION_LINE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{LIBRARY_VERSION} (contract {CONTRACT_VERSION}; document formats read {}, newest written {NEWEST_FORMAT})",
        formats_read()
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_contract_and_the_formats() {
        let line = VERSION_LINE.as_str();
        assert!(line.starts_with(LIBRARY_VERSION), "{line}");
        assert!(line.contains("contract 1.4"), "{line}");
        assert!(line.contains("formats read 1-2, newest written 2"), "{line}");
    }
}
