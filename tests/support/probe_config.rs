//! The `lockprobe serve` configuration file as the tests write it: a [`ProbeConfig`] of
//! [`TargetConfig`]s, built as a TOML document with the `toml` crate (so paths, URLs and
//! names are quoted and escaped as TOML wants them) rather than typed out in a `format!`.
//!
//! [`TargetConfig::new`] starts from what most tests' targets share (see there); any key
//! can be set or overridden with [`TargetConfig::set`] and dropped with
//! [`TargetConfig::remove`], so a test states only what is particular to it:
//!
//! ```ignore
//! let path = ProbeConfig::new(dir.join("state.json"))
//!     .listen("127.0.0.1:0")
//!     .target(TargetConfig::new("kill", &svc.urls).api_key_env(KEY_ENV).buffer("60s").schedule("* * * * * *"))
//!     .write(dir);
//! ```
//!
//! A configuration that is itself under test (the production-style example of
//! tests/probe_config.rs, deliberately malformed files) stays literal text in its test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use toml::{Table, Value};

/// The whole file: `listen`, `state_file`, the `[[targets]]` and an optional `[monitor]`.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    top: Table,
    targets: Vec<TargetConfig>,
    monitor: Option<Table>,
    raw: String,
}

impl ProbeConfig {
    /// A configuration that records its locks in `state_file`, with no `listen` (the
    /// probe's default, or `serve --listen`) and no target yet.
    pub fn new(state_file: impl AsRef<Path>) -> Self {
        let mut top = Table::new();
        top.insert("state_file".into(), path_value(state_file.as_ref()));
        Self { top, targets: Vec::new(), monitor: None, raw: String::new() }
    }

    /// The probe's own HTTP address (`listen`), e.g. `127.0.0.1:0`.
    pub fn listen(self, addr: impl ToString) -> Self {
        self.set("listen", addr.to_string())
    }

    /// Sets a top-level key (`max_concurrent_cycles`, …), replacing any earlier value.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.top.insert(key.into(), value.into());
        self
    }

    /// Drops a top-level key.
    pub fn remove(mut self, key: &str) -> Self {
        self.top.remove(key);
        self
    }

    /// Adds a `[[targets]]` entry, after those added before.
    pub fn target(mut self, target: TargetConfig) -> Self {
        self.targets.push(target);
        self
    }

    /// The `[monitor]` table: the `lockprobe monitor` flags without their dashes, `_` for
    /// `-` (see [`table`] for writing one).
    pub fn monitor(mut self, monitor: Table) -> Self {
        self.monitor = Some(monitor);
        self
    }

    /// TOML text appended as it is after the generated document (a table of its own,
    /// such as a hand-written `[monitor]`).
    pub fn raw(mut self, text: impl AsRef<str>) -> Self {
        self.raw.push('\n');
        self.raw.push_str(text.as_ref());
        self
    }

    /// The document as TOML text.
    pub fn to_toml(&self) -> String {
        let mut doc = self.top.clone();
        if !self.targets.is_empty() {
            let targets = self.targets.iter().map(|t| Value::Table(t.table.clone())).collect();
            doc.insert("targets".into(), Value::Array(targets));
        }
        if let Some(monitor) = &self.monitor {
            doc.insert("monitor".into(), Value::Table(monitor.clone()));
        }
        let mut text = toml::to_string(&doc).expect("the configuration serializes as TOML");
        text.push_str(&self.raw);
        text
    }

    /// Writes the document to `dir/probe.toml` and returns that path.
    pub fn write(&self, dir: impl AsRef<Path>) -> PathBuf {
        self.write_as(dir, "probe.toml")
    }

    /// Writes the document to `dir/name` and returns that path.
    pub fn write_as(&self, dir: impl AsRef<Path>, name: &str) -> PathBuf {
        let path = dir.as_ref().join(name);
        std::fs::write(&path, self.to_toml()).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }
}

/// One `[[targets]]` entry.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    table: Table,
}

impl TargetConfig {
    /// Target `name` over `instances`, with what most tests' targets share: `test_prefix
    /// = "probe-"`, `pool_size = 7`, `cache_ttl = "1s"` and `replication_bound = "500ms"`
    /// (the test services' usual convergence), `timeout = "60s"`, and `[targets.leases]`
    /// long enough for a cycle (`pre_lock = "10m"`, `hard_delete = "5m"`, `write = "2m"`)
    /// with a 1 s `short_write`. No schedule (every test names its own: `schedule`), no
    /// buffer and no key source (the probe's defaults until set).
    pub fn new<S: Into<String>>(name: &str, instances: impl IntoIterator<Item = S>) -> Self {
        let instances: Vec<Value> = instances.into_iter().map(|i| Value::String(i.into())).collect();
        Self { table: Table::new() }
            .set("name", name)
            .set("instances", instances)
            .set("test_prefix", "probe-")
            .set("pool_size", 7)
            .set("cache_ttl", "1s")
            .set("replication_bound", "500ms")
            .set("timeout", "60s")
            .leases("10m", "5m", "2m", "1s")
    }

    /// Sets `key` (any key of a target), replacing its value or the default.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.table.insert(key.into(), value.into());
        self
    }

    /// Drops `key`, a default included (`remove("leases")` leaves the probe's leases).
    pub fn remove(mut self, key: &str) -> Self {
        self.table.remove(key);
        self
    }

    /// `api_key_env`: the variable that holds the lock API key.
    pub fn api_key_env(self, var: &str) -> Self {
        self.set("api_key_env", var)
    }

    /// `api_key_file`: the file that holds the lock API key.
    pub fn api_key_file(self, path: impl AsRef<Path>) -> Self {
        self.set("api_key_file", path_value(path.as_ref()))
    }

    /// `ca_file`: CA certificates trusted for `https` instances.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Self {
        self.set("ca_file", path_value(path.as_ref()))
    }

    /// `client_cert_file`: the certificate presented for mutual TLS.
    pub fn client_cert_file(self, path: impl AsRef<Path>) -> Self {
        self.set("client_cert_file", path_value(path.as_ref()))
    }

    /// `client_key_file`: the key of `client_cert_file`.
    pub fn client_key_file(self, path: impl AsRef<Path>) -> Self {
        self.set("client_key_file", path_value(path.as_ref()))
    }

    /// `test_prefix`: the prefix of the target's test resources.
    pub fn test_prefix(self, prefix: &str) -> Self {
        self.set("test_prefix", prefix)
    }

    /// `buffer`: waited beyond the declared convergence delay, e.g. `"500ms"`.
    pub fn buffer(self, buffer: &str) -> Self {
        self.set("buffer", buffer)
    }

    /// `schedule`: when cycles fire (cron with seconds).
    pub fn schedule(self, schedule: &str) -> Self {
        self.set("schedule", schedule)
    }

    /// `timeout`: the most one cycle may take.
    pub fn timeout(self, timeout: &str) -> Self {
        self.set("timeout", timeout)
    }

    /// The `[targets.leases]` table, replacing the default one.
    pub fn leases(self, pre_lock: &str, hard_delete: &str, write: &str, short_write: &str) -> Self {
        let leases = table([
            ("pre_lock", pre_lock.into()),
            ("hard_delete", hard_delete.into()),
            ("write", write.into()),
            ("short_write", short_write.into()),
        ]);
        self.set("leases", leases)
    }
}

/// A TOML table of `(key, value)` pairs, e.g. for [`ProbeConfig::monitor`]:
/// `table([("store", "cosmos".into()), ("cosmos_preferred_region", vec!["x"].into())])`.
pub fn table<const N: usize>(pairs: [(&str, Value); N]) -> Table {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A path as a TOML string (test paths are UTF-8).
fn path_value(path: &Path) -> Value {
    Value::String(path.to_str().unwrap_or_else(|| panic!("{} is not UTF-8", path.display())).to_owned())
}
