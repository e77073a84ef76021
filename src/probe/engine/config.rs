//! TOML configuration of `lockprobe serve`: the probe's own listen address, its state file
//! and the targets it probes. Parsed with `deny_unknown_fields` and checked by
//! [`Config::validate`], whose errors name the offending field.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::scheduler::{parse_schedule, TargetSchedule};
use crate::probe::checks::credentials::{
    read_admin_key, read_api_key, CredentialError, CredentialFile, TargetTls, TlsFiles,
};
use crate::probe::checks::settings::{
    AdminKeys, CycleWaits, Leases, ProbeSettings, CONVERGENCE_TOLERANCE_CONSTANT, PRIMING_LIMIT, RESOURCES_PER_CYCLE,
    SKEW_MARGIN_WAIT,
};
use crate::probe::checks::target::check_instance_url;

/// A configuration problem, always naming the field it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// Path of the file.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse into the schema (unknown or missing field, wrong type).
    #[error("{0}")]
    Parse(String),
    /// A field parsed but its value is not acceptable.
    #[error("{field}: {message}")]
    Invalid {
        /// Dotted path of the field, e.g. `targets[0].schedule`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), message: message.into() }
    }
}

/// The whole configuration file, with its `[monitor]` table read as `M`.
///
/// The probe knows nothing of the monitor (it never imports what runs beside it), so
/// the table's type is the caller's: `serve` reads it as the monitor's settings, typed
/// and checked in this one parse; the default keeps it as a TOML table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "M: serde::de::DeserializeOwned"))]
pub struct Config<M = toml::Table> {
    /// Address of the probe's own HTTP server (`/metrics`, `/api/v1/status`, `/`).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where the probe records the locks it holds, so a restarted probe releases them.
    #[serde(default = "default_state_file")]
    pub state_file: PathBuf,
    /// Cycles of all targets that may run at once in this process; a cycle beyond it
    /// waits for a slot, counted in `lockprobe_probe_cycles_held_back_total`. A restart
    /// applies a change.
    #[serde(default = "default_max_concurrent_cycles")]
    pub max_concurrent_cycles: usize,
    /// The services to probe.
    pub targets: Vec<TargetConfig>,
    /// Optional: run the convergence monitor over the routing store this table names.
    /// Keys are the `lockprobe monitor` flags without their dashes, `_` for `-` (`store`,
    /// `cosmos_endpoint`, `monitor_escalation_buffer`, …); `M` reads them (see [`Config`]).
    #[serde(default = "Option::default")]
    pub monitor: Option<M>,
}

/// One service to probe. Equality tells a reload which targets changed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Name used in metrics labels and the status page.
    pub name: String,
    /// Base URLs of every instance of the service.
    pub instances: Vec<String>,
    /// Name of the environment variable that holds the lock API key
    /// (`LOCKPROBE_LOCK_API_KEY` when neither this nor `api_key_file` is given).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File that holds the lock API key (a mounted secret), instead of `api_key_env`.
    /// Read when the configuration is loaded (and on every reload).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// PEM bundle of CA certificates trusted for `https` instances, besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to instances that require mutual TLS.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// Two admin principals' key files (contract 1.4), the requesting principal's
    /// first: when given, every cycle also force-releases a write lock of its own
    /// (`negative/force-release`). The service must scope both to the test prefix.
    #[serde(default)]
    pub admin_key_files: Vec<PathBuf>,
    /// What the files above held, read by [`Config::load`] (never serialized or logged);
    /// `None` in a configuration deserialized some other way, which reads them when asked.
    #[serde(skip)]
    loaded: Option<Loaded>,
    /// Prefix of the test resources; the probe refuses to lock anything else.
    pub test_prefix: String,
    /// How many test resources (`<prefix>0001` ...) the probe may use.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// The two locations a cycle swaps a resource between.
    #[serde(default = "default_locations")]
    pub locations: Vec<String>,
    /// Expected maximum cache TTL across the service's tiers (the operator's expectation).
    #[serde(with = "crate::duration::human")]
    pub cache_ttl: Duration,
    /// Expected replication bound of the service's store; the probe never waits less.
    #[serde(with = "crate::duration::human")]
    pub replication_bound: Duration,
    /// Extra wait on top of the declared convergence delay.
    #[serde(default = "default_buffer", with = "crate::duration::human")]
    pub buffer: Duration,
    /// Lease lengths requested for each lock phase.
    #[serde(default)]
    pub leases: LeaseConfig,
    /// Cron expression (seconds first, as the `cron` crate reads it).
    pub schedule: String,
    /// Random delay added to each scheduled start, up to this much.
    #[serde(default, with = "crate::duration::human")]
    pub jitter: Duration,
    /// A cycle that runs longer is cancelled and its locks released.
    #[serde(with = "crate::duration::human")]
    pub timeout: Duration,
    /// Timeout of one HTTP request.
    #[serde(default = "default_request_timeout", with = "crate::duration::human")]
    pub request_timeout: Duration,
    /// How many cycles of this target may run at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// How often the route view is polled while measuring convergence.
    #[serde(default = "default_poll_interval", with = "crate::duration::human")]
    pub poll_interval: Duration,
    /// How many pre-locks the concurrent-pre-lock check sends at once.
    #[serde(default = "default_concurrent_pre_locks")]
    pub concurrent_pre_locks: usize,
    /// The largest share of a check's operations that may be inconclusive before the
    /// check fails as `inconclusive` (0 to 1; `docs/probe.md`, "Decision windows").
    #[serde(default = "default_max_inconclusive")]
    pub max_inconclusive: f64,
}

fn default_max_inconclusive() -> f64 {
    crate::probe::checks::settings::DEFAULT_MAX_INCONCLUSIVE
}

/// Lease lengths per phase, in the TOML `[targets.leases]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    /// Parent lease of the whole migration.
    #[serde(with = "crate::duration::human")]
    pub pre_lock: Duration,
    /// Lease of the hard-delete phase.
    #[serde(with = "crate::duration::human")]
    pub hard_delete: Duration,
    /// Lease of the write phase.
    #[serde(with = "crate::duration::human")]
    pub write: Duration,
    /// Short write lease used by the lease-lapse negative check.
    #[serde(with = "crate::duration::human")]
    pub short_write: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        let l = Leases::default();
        Self { pre_lock: l.pre_lock, hard_delete: l.hard_delete, write: l.write, short_write: l.short_write }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}
fn default_max_concurrent_cycles() -> usize {
    DEFAULT_MAX_CONCURRENT_CYCLES
}
/// The default of `max_concurrent_cycles`: a thousand targets' cycles at once
/// (BENCHMARKS.md, "Probe engine at scale") fit, and a configuration that would start far
/// more at once than a process can time is held back, counted and alerted on.
pub const DEFAULT_MAX_CONCURRENT_CYCLES: usize = 1000;
/// The most `max_concurrent_cycles` may be: far past what one process can time (about
/// 1,000 at once on two cores, BENCHMARKS.md), so a larger value is a typo.
pub const MAX_CONCURRENT_CYCLES_LIMIT: usize = 100_000;
/// The most test resources a target may have (`pool_size`): the probe keeps their names
/// for every target it runs, and a pool is sized by `concurrency` (five resources a cycle),
/// so a larger value is a typo, not a plan (one of 4,000,000,000 aborted `serve`).
pub const MAX_POOL_SIZE: usize = 10_000;
/// The most cycles of one target that may run at once (`concurrency`).
pub const MAX_CONCURRENCY: usize = 1_000;
/// The most pre-locks the concurrent-pre-lock check may send at once: enough to race every
/// instance many times over, few enough not to be a flood of the service.
pub const MAX_CONCURRENT_PRE_LOCKS: usize = 64;
fn default_state_file() -> PathBuf {
    PathBuf::from("lockprobe-state.json")
}
/// The variable the key is read from when a target names neither a variable nor a file.
pub const DEFAULT_KEY_ENV: &str = "LOCKPROBE_LOCK_API_KEY";

/// The contents of a target's credential files, as read when the configuration was loaded.
#[derive(Clone, Default, PartialEq)]
struct Loaded {
    /// The key from `api_key_file`.
    api_key: Option<String>,
    /// The keys from `admin_key_files`.
    admin_keys: Option<(String, String)>,
    /// From `ca_file`, `client_cert_file` and `client_key_file`.
    tls: TargetTls,
}

impl std::fmt::Debug for Loaded {
    // Hand-written so the key from a file can never reach a log line through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("admin_keys", &self.admin_keys.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}
fn default_pool_size() -> usize {
    RESOURCES_PER_CYCLE * 2
}
fn default_locations() -> Vec<String> {
    vec!["westeurope".to_string(), "northeurope".to_string()]
}
fn default_buffer() -> Duration {
    Duration::from_secs(60)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_concurrency() -> usize {
    1
}
fn default_poll_interval() -> Duration {
    Duration::from_millis(200)
}
fn default_concurrent_pre_locks() -> usize {
    4
}

impl<M: serde::de::DeserializeOwned> FromStr for Config<M> {
    type Err = ConfigError;

    /// Parses and validates a configuration held in a string, and reads the credential
    /// files it names.
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config<M> = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        for (i, t) in config.targets.iter_mut().enumerate() {
            t.loaded = Some(t.read_credentials(i)?);
        }
        Ok(config)
    }
}

impl<M: serde::de::DeserializeOwned> Config<M> {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        text.parse()
    }

    /// Checks every value that parsed but may still be unusable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.targets.is_empty() {
            return Err(ConfigError::invalid("targets", "at least one target is required"));
        }
        if !(1..=MAX_CONCURRENT_CYCLES_LIMIT).contains(&self.max_concurrent_cycles) {
            return Err(ConfigError::invalid(
                "max_concurrent_cycles",
                format!("must be between 1 and {MAX_CONCURRENT_CYCLES_LIMIT}, got {}", self.max_concurrent_cycles),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            t.validate(i)?;
            if !names.insert(t.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("targets[{i}].name"),
                    format!("duplicate target {:?}", t.name),
                ));
            }
        }
        Ok(())
    }
}

impl TargetConfig {
    /// Checks target `index`: where it is, how it is scheduled, how long it waits.
    fn validate(&self, index: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("targets[{index}].{name}");
        self.check_identity(index, field)?;
        self.check_schedule(field)?;
        self.check_durations(field)
    }

    /// Name, instances, key variable, test prefix and locations.
    fn check_identity(&self, index: usize, field: impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.name.trim().is_empty() {
            return Err(ConfigError::invalid(field("name"), "must not be empty"));
        }
        if !self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(ConfigError::invalid(field("name"), "only letters, digits, '-' and '_' are allowed"));
        }
        if self.instances.is_empty() {
            return Err(ConfigError::invalid(field("instances"), "at least one instance URL is required"));
        }
        for (j, url) in self.instances.iter().enumerate() {
            check_instance_url(url).map_err(|m| ConfigError::invalid(format!("targets[{index}].instances[{j}]"), m))?;
        }
        match (&self.api_key_env, &self.api_key_file) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    field("api_key_file"),
                    "give either api_key_env or api_key_file, not both",
                ))
            }
            (Some(var), None) if var.trim().is_empty() => {
                return Err(ConfigError::invalid(field("api_key_env"), "must name an environment variable"))
            }
            (None, Some(path)) if path.as_os_str().is_empty() => {
                return Err(ConfigError::invalid(field("api_key_file"), "must name a file"))
            }
            _ => {}
        }
        if self.test_prefix.trim().is_empty() {
            return Err(ConfigError::invalid(
                field("test_prefix"),
                "must not be empty (the probe only locks resources under it)",
            ));
        }
        if self.locations.len() != 2 || self.locations[0] == self.locations[1] {
            return Err(ConfigError::invalid(field("locations"), "must list exactly two distinct locations"));
        }
        match self.admin_key_files.as_slice() {
            [] => {}
            [a, b] if a.as_os_str().is_empty() || b.as_os_str().is_empty() => {
                return Err(ConfigError::invalid(field("admin_key_files"), "must name two files"))
            }
            [a, b] if a == b => {
                return Err(ConfigError::invalid(
                    field("admin_key_files"),
                    "names one file twice: the check needs two principals",
                ))
            }
            [_, _] => {}
            more => {
                return Err(ConfigError::invalid(
                    field("admin_key_files"),
                    format!(
                        "must name two files (the requesting principal's key, then the approving one's), got {}",
                        more.len()
                    ),
                ))
            }
        }
        Ok(())
    }

    /// Concurrency, the pool it needs, the cron expression, the inconclusive cap and the
    /// pre-lock race.
    fn check_schedule(&self, field: impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(ConfigError::invalid(
                field("concurrency"),
                format!("must be between 1 and {MAX_CONCURRENCY}, got {}", self.concurrency),
            ));
        }
        if self.pool_size > MAX_POOL_SIZE {
            return Err(ConfigError::invalid(
                field("pool_size"),
                format!("must be at most {MAX_POOL_SIZE}, got {}", self.pool_size),
            ));
        }
        let needed = RESOURCES_PER_CYCLE * self.concurrency;
        if self.pool_size < needed {
            return Err(ConfigError::invalid(
                field("pool_size"),
                format!(
                    "must be at least {needed} ({RESOURCES_PER_CYCLE} resources per cycle x concurrency {})",
                    self.concurrency
                ),
            ));
        }
        if let Err(e) = parse_schedule(&self.schedule) {
            return Err(ConfigError::invalid(field("schedule"), e));
        }
        crate::probe::checks::settings::check_max_inconclusive(self.max_inconclusive)
            .map_err(|why| ConfigError::invalid(field("max_inconclusive"), why))?;
        if !(2..=MAX_CONCURRENT_PRE_LOCKS).contains(&self.concurrent_pre_locks) {
            return Err(ConfigError::invalid(
                field("concurrent_pre_locks"),
                format!("must be between 2 and {MAX_CONCURRENT_PRE_LOCKS}, got {}", self.concurrent_pre_locks),
            ));
        }
        Ok(())
    }

    /// Timeouts and leases: positive, and long enough for the wait before escalating.
    fn check_durations(&self, field: impl Fn(&str) -> String) -> Result<(), ConfigError> {
        let l = &self.leases;
        for (name, d) in [
            ("timeout", self.timeout),
            ("request_timeout", self.request_timeout),
            ("poll_interval", self.poll_interval),
            ("leases.pre_lock", l.pre_lock),
            ("leases.hard_delete", l.hard_delete),
            ("leases.write", l.write),
            ("leases.short_write", l.short_write),
        ] {
            if d.is_zero() {
                return Err(ConfigError::invalid(field(name), "must be longer than zero"));
            }
        }
        // Every cycle holds its pre-lock through the wait before escalating: a lease
        // that ends first would fail every cycle.
        let declared = self.cache_ttl + self.replication_bound;
        let waits = CycleWaits::new(declared, self.buffer, self.replication_bound, self.poll_interval, l.short_write);
        let waits = if self.admin_key_files.is_empty() { waits } else { waits.with_force_release() };
        if l.pre_lock <= waits.escalation {
            return Err(ConfigError::invalid(
                field("leases.pre_lock"),
                format!(
                    "must be longer than max(cache_ttl + replication_bound + buffer, replication_bound) ({}), the wait before escalating",
                    fmt(waits.escalation)
                ),
            ));
        }
        // A timeout below the waits the cycle schedules itself cancels every cycle.
        if self.timeout <= waits.total() {
            return Err(ConfigError::invalid(field("timeout"), self.worst_case_arithmetic(&waits)));
        }
        if l.short_write >= l.write {
            return Err(ConfigError::invalid(field("leases.short_write"), "must be shorter than leases.write"));
        }
        Ok(())
    }
}

impl TargetConfig {
    /// Why `timeout` is too short, with the arithmetic of the worst-case cycle.
    fn worst_case_arithmetic(&self, w: &CycleWaits) -> String {
        let declared = self.cache_ttl + self.replication_bound;
        format!(
            "{} is not longer than the worst-case cycle of {} (waits only, requests take their time on top): \
             main walk {} (priming at most {} + wait before escalating {} = max(cache_ttl {} + replication_bound {} + buffer {}, replication_bound); \
             convergence watched at least declared {} + poll_interval {} + {}; + skew allowance {}) \
             + the longest check {}: write-lease-lapse check {} (wait before escalating {} + leases.short_write {} + max(buffer, 200ms) {} \
             + skew-margin allowance {}){}",
            fmt(self.timeout),
            fmt(w.total()),
            fmt(w.main_walk),
            fmt(PRIMING_LIMIT),
            fmt(w.escalation),
            fmt(self.cache_ttl),
            fmt(self.replication_bound),
            fmt(self.buffer),
            fmt(declared),
            fmt(self.poll_interval),
            fmt(CONVERGENCE_TOLERANCE_CONSTANT),
            fmt(SKEW_MARGIN_WAIT),
            fmt(w.checks()),
            fmt(w.lapse_check),
            fmt(w.escalation),
            fmt(self.leases.short_write),
            fmt(self.buffer.max(Duration::from_millis(200))),
            fmt(SKEW_MARGIN_WAIT),
            match w.force_release_check {
                Some(d) => format!(
                    ", force-release check {} (wait before escalating {} twice: before escalating and after the approval, + skew allowance {})",
                    fmt(d),
                    fmt(w.escalation),
                    fmt(SKEW_MARGIN_WAIT)
                ),
                None => String::new(),
            },
        )
    }
}

/// A duration as people write it (`1h 15m`).
fn fmt(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

impl TargetConfig {
    /// The TLS files this target names.
    fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert_file.clone(),
            client_key: self.client_key_file.clone(),
        }
    }

    /// Reads the key file and the TLS files of target `index`; errors name the field and
    /// the path, never what the file holds.
    fn read_credentials(&self, index: usize) -> Result<Loaded, ConfigError> {
        let named = |e: CredentialError| {
            let name = match e.file {
                CredentialFile::ApiKey => "api_key_file",
                CredentialFile::AdminKey => "admin_key_files",
                CredentialFile::CaFile => "ca_file",
                CredentialFile::ClientCert => "client_cert_file",
                CredentialFile::ClientKey => "client_key_file",
            };
            ConfigError::invalid(format!("targets[{index}].{name}"), e.to_string())
        };
        let api_key = self.api_key_file.as_deref().map(read_api_key).transpose().map_err(named)?;
        let tls = TargetTls::load(&self.tls_files()).map_err(named)?;
        let admin_keys = match self.admin_key_files.as_slice() {
            [requester, approver] => {
                Some((read_admin_key(requester).map_err(&named)?, read_admin_key(approver).map_err(&named)?))
            }
            _ => None,
        };
        Ok(Loaded { api_key, admin_keys, tls })
    }
}

impl<M> Config<M> {
    /// Settings and schedule of every target, with each lock API key from its file (read
    /// when the configuration was loaded) or its variable.
    pub fn probe_targets(&self) -> Result<Vec<(ProbeSettings, TargetSchedule)>, ConfigError> {
        self.targets.iter().enumerate().map(|(i, t)| Ok((t.settings(i)?, t.schedule(i)?))).collect()
    }
}

impl TargetConfig {
    /// The schedule of this target, with its pool `<prefix>0001` ... `<prefix>NNNN`.
    pub fn schedule(&self, index: usize) -> Result<TargetSchedule, ConfigError> {
        let schedule = parse_schedule(&self.schedule)
            .map_err(|e| ConfigError::invalid(format!("targets[{index}].schedule"), e))?;
        Ok(TargetSchedule {
            name: self.name.clone(),
            schedule,
            jitter: self.jitter,
            concurrency: self.concurrency,
            timeout: self.timeout,
            pool: (1..=self.pool_size).map(|i| format!("{}{i:04}", self.test_prefix)).collect(),
        })
    }

    /// The probe settings of this target, with the lock API key from its file (read when
    /// the configuration was loaded) or from its variable (read now).
    pub fn settings(&self, index: usize) -> Result<ProbeSettings, ConfigError> {
        let loaded = match &self.loaded {
            Some(loaded) => loaded.clone(),
            None => self.read_credentials(index)?,
        };
        let api_key = match loaded.api_key {
            Some(key) => key,
            None => {
                let var = self.api_key_env.as_deref().unwrap_or(DEFAULT_KEY_ENV);
                std::env::var(var).map_err(|_| {
                    ConfigError::invalid(
                        format!("targets[{index}].api_key_env"),
                        format!("environment variable {var} is not set"),
                    )
                })?
            }
        };
        let force_release = loaded
            .admin_keys
            .map(|(requester, approver)| AdminKeys::checked(requester, approver, &api_key))
            .transpose()
            .map_err(|why| ConfigError::invalid(format!("targets[{index}].admin_key_files"), why))?;
        Ok(ProbeSettings {
            name: self.name.clone(),
            instances: self.instances.clone(),
            api_key,
            tls: loaded.tls,
            test_prefix: self.test_prefix.clone(),
            locations: [self.locations[0].clone(), self.locations[1].clone()],
            expected_convergence: Some(self.cache_ttl + self.replication_bound),
            replication_bound: self.replication_bound,
            buffer: self.buffer,
            leases: Leases {
                pre_lock: self.leases.pre_lock,
                hard_delete: self.leases.hard_delete,
                write: self.leases.write,
                short_write: self.leases.short_write,
            },
            request_timeout: self.request_timeout,
            poll_interval: self.poll_interval,
            concurrent_pre_locks: self.concurrent_pre_locks,
            owner: format!("lockprobe/{}", self.name),
            // `serve` runs the walk and the negative checks; the eager checks are
            // `validate --eager`'s and the release gate's.
            eager: false,
            force_release,
            max_inconclusive: self.max_inconclusive,
            clock: Arc::new(crate::clock::SystemClock),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:9464"
state_file = "/tmp/lockprobe-state.json"

[[targets]]
name = "demo"
instances = ["http://127.0.0.1:8080", "http://127.0.0.1:8081"]
test_prefix = "probe-"
pool_size = 14
cache_ttl = "1h"
replication_bound = "5m"
buffer = "10m"
schedule = "0 0 */6 * * *"
timeout = "60h"
concurrency = 2

[targets.leases]
pre_lock = "48h"
hard_delete = "6h"
write = "5m"
short_write = "30s"
"#;

    fn err_of(text: &str) -> String {
        text.parse::<Config>().unwrap_err().to_string()
    }

    #[test]
    fn good_config_parses_with_human_durations() {
        let c: Config = GOOD.parse().unwrap();
        assert_eq!(c.targets[0].cache_ttl, Duration::from_secs(3600));
        assert_eq!(c.targets[0].leases.pre_lock, Duration::from_secs(48 * 3600));
        assert_eq!(c.targets[0].locations, vec!["westeurope", "northeurope"]);
    }

    #[test]
    fn unknown_field_is_named() {
        let e = err_of(&GOOD.replace("concurrency = 2", "concurrency = 2\nconcurency = 3"));
        assert!(e.contains("concurency"), "{e}");
    }

    #[test]
    fn bad_cron_names_the_field() {
        let e = err_of(&GOOD.replace("0 0 */6 * * *", "every six hours"));
        assert!(e.starts_with("targets[0].schedule:"), "{e}");
    }

    #[test]
    fn bad_duration_names_the_key() {
        let e = err_of(&GOOD.replace("\"1h\"", "\"an hour\""));
        assert!(e.contains("cache_ttl") && e.contains("expected a duration"), "{e}");
    }

    #[test]
    fn durations_over_ten_years_are_refused_naming_the_key() {
        for (from, to, key) in [
            ("\"1h\"", "\"500000years\"", "cache_ttl"),
            ("timeout = \"60h\"", "timeout = \"10years 1s\"", "timeout"),
            ("short_write = \"30s\"", "short_write = \"87661h\"", "short_write"),
        ] {
            let e = err_of(&GOOD.replace(from, to));
            assert!(e.contains(key) && e.contains("over the limit of 10years"), "{to}: {e}");
        }
        let ten_years = GOOD.replace("timeout = \"60h\"", "timeout = \"10years\"");
        assert_eq!(ten_years.parse::<Config>().unwrap().targets[0].timeout, crate::duration::MAX_DURATION);
    }

    #[test]
    fn max_concurrent_cycles_defaults_and_a_bad_value_is_refused_naming_it() {
        let c: Config = GOOD.parse().unwrap();
        assert_eq!(c.max_concurrent_cycles, DEFAULT_MAX_CONCURRENT_CYCLES);
        let with = |v: &str| format!("max_concurrent_cycles = {v}\n{GOOD}");
        assert_eq!(with("64").parse::<Config>().unwrap().max_concurrent_cycles, 64);
        for bad in ["0", "100001"] {
            let e = err_of(&with(bad));
            assert!(e.starts_with("max_concurrent_cycles: must be between 1 and 100000"), "{bad}: {e}");
        }
        let e = err_of(&with("-1"));
        assert!(e.contains("max_concurrent_cycles"), "{e}");
    }

    #[test]
    fn pool_too_small_for_concurrency() {
        let e = err_of(&GOOD.replace("pool_size = 14", "pool_size = 9"));
        assert!(e.starts_with("targets[0].pool_size:"), "{e}");
    }

    #[test]
    fn a_pre_lock_lease_or_timeout_within_the_convergence_wait_is_refused() {
        // cache_ttl 1h + replication_bound 5m + buffer 10m = 1h15m before escalating.
        let e = err_of(&GOOD.replace("pre_lock = \"48h\"", "pre_lock = \"1h\""));
        assert!(e.starts_with("targets[0].leases.pre_lock:") && e.contains("1h 15m"), "{e}");
        let e = err_of(&GOOD.replace("timeout = \"60h\"", "timeout = \"75m\""));
        assert!(e.starts_with("targets[0].timeout:"), "{e}");
    }

    #[test]
    fn a_timeout_below_the_worst_case_cycle_is_refused_with_the_arithmetic() {
        // A 2s wait before escalating (1s + 500ms + 500ms): the main walk primes (3s at
        // most), waits it and has its skew allowance, the lapse check waits it again, then
        // its short lease, the buffer and its skew allowance:
        // (3s + 2s + 5s) + (2s + 1s + 500ms + 5s) = 18.5s.
        let small = GOOD
            .replace("cache_ttl = \"1h\"", "cache_ttl = \"1s\"")
            .replace("replication_bound = \"5m\"", "replication_bound = \"500ms\"")
            .replace("buffer = \"10m\"", "buffer = \"500ms\"")
            .replace("short_write = \"30s\"", "short_write = \"1s\"");
        for timeout in ["3s", "10s", "18s 500ms"] {
            let e = err_of(&small.replace("timeout = \"60h\"", &format!("timeout = \"{timeout}\"")));
            assert!(e.starts_with("targets[0].timeout:"), "{e}");
            assert!(e.contains("worst-case cycle of 18s 500ms"), "{e}");
            assert!(e.contains("main walk 10s") && e.contains("write-lease-lapse check 8s 500ms"), "{e}");
        }
        small.replace("timeout = \"60h\"", "timeout = \"19s\"").parse::<Config>().unwrap();
    }

    #[test]
    fn bad_instance_url_names_index() {
        let e = err_of(&GOOD.replace("http://127.0.0.1:8081", "127.0.0.1:8081"));
        assert!(e.starts_with("targets[0].instances[1]:"), "{e}");
    }

    #[test]
    fn empty_prefix_refused() {
        let e = err_of(&GOOD.replace("test_prefix = \"probe-\"", "test_prefix = \"\""));
        assert!(e.starts_with("targets[0].test_prefix:"), "{e}");
    }

    #[test]
    fn missing_key_variable_names_field() {
        let c: Config = GOOD
            .replace("name = \"demo\"", "name = \"demo\"\napi_key_env = \"LOCKPROBE_TEST_SURELY_UNSET_VAR\"")
            .parse()
            .unwrap();
        let e = c.targets[0].settings(0).unwrap_err().to_string();
        assert!(e.starts_with("targets[0].api_key_env:"), "{e}");
    }

    #[test]
    fn admin_key_files_give_the_force_release_check_two_principals_or_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let (a, b) = (file("a", "admin-a-0123456789\n"), file("b", "admin-b-0123456789\n"));
        let lock_key = file("lock", "lock-key-0123456789");
        let with = |files: &[&str]| {
            let list: Vec<String> = files.iter().map(|f| format!("{f:?}")).collect();
            let keys = format!("name = \"demo\"\napi_key_file = {lock_key:?}\nadmin_key_files = [{}]", list.join(", "));
            GOOD.replace("name = \"demo\"", &keys)
        };
        let c: Config = with(&[&a, &b]).parse().unwrap();
        let keys = c.targets[0].settings(0).unwrap().force_release.expect("the check runs");
        assert_eq!((keys.requester.as_str(), keys.approver.as_str()), ("admin-a-0123456789", "admin-b-0123456789"));
        assert!(!format!("{c:?}").contains("admin-a-0123456789"), "{c:?}");
        for (files, says) in [
            (vec![a.as_str()], "targets[0].admin_key_files: must name two files"),
            (vec![&a, &b, &b], "targets[0].admin_key_files: must name two files"),
            (vec![&a, &a], "targets[0].admin_key_files: names one file twice"),
            (vec![&a, ""], "targets[0].admin_key_files: must name two files"),
        ] {
            let e = err_of(&with(&files));
            assert!(e.starts_with(says), "{files:?}: {e}");
        }
        let short = file("short", "admin\n");
        let e = err_of(&with(&[&a, &short]));
        assert!(e.starts_with("targets[0].admin_key_files:") && e.contains("shorter than 16"), "{e}");
        for (other, says) in [
            (file("same", "admin-a-0123456789"), "the two admin keys are the same"),
            (file("lock-again", "lock-key-0123456789"), "an admin key is the lock API key"),
        ] {
            let c: Config = with(&[&a, &other]).parse().unwrap();
            let e = c.targets[0].settings(0).unwrap_err().to_string();
            assert!(e.starts_with(&format!("targets[0].admin_key_files: {says}")), "{e}");
        }
    }

    #[test]
    fn the_force_release_check_lengthens_the_worst_case_cycle() {
        // As below, 18.5s without it; with it the longest check waits 2s twice and has its
        // skew allowance: 10s + max(8.5s, 2s + 2s + 5s) = 19s.
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "admin-a-0123456789").unwrap();
        std::fs::write(&b, "admin-b-0123456789").unwrap();
        let small = GOOD
            .replace("cache_ttl = \"1h\"", "cache_ttl = \"1s\"")
            .replace("replication_bound = \"5m\"", "replication_bound = \"500ms\"")
            .replace("buffer = \"10m\"", "buffer = \"500ms\"")
            .replace("short_write = \"30s\"", "short_write = \"1s\"")
            .replace("name = \"demo\"", &format!("name = \"demo\"\nadmin_key_files = [{:?}, {:?}]", a, b));
        let e = err_of(&small.replace("timeout = \"60h\"", "timeout = \"19s\""));
        assert!(e.contains("worst-case cycle of 19s") && e.contains("force-release check 9s"), "{e}");
        small.replace("timeout = \"60h\"", "timeout = \"19s 100ms\"").parse::<Config>().unwrap();
    }

    #[test]
    fn a_key_from_a_file_is_read_at_load_and_never_debug_printed() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "file-key-value\n").unwrap();
        let text = GOOD
            .replace("name = \"demo\"", &format!("name = \"demo\"\napi_key_file = {:?}", key.display().to_string()));
        let c: Config = text.parse().unwrap();
        // Read when loaded: the file may go (a rotated secret) without the settings changing.
        std::fs::remove_file(&key).unwrap();
        assert_eq!(c.targets[0].settings(0).unwrap().api_key, "file-key-value");
        assert!(!format!("{c:?}").contains("file-key-value"), "{c:?}");
        let e = err_of(&text);
        assert!(e.starts_with("targets[0].api_key_file:") && e.contains("cannot read"), "{e}");
        let both = text.replace("api_key_file", "api_key_env = \"SOME_VAR\"\napi_key_file");
        assert!(err_of(&both).starts_with("targets[0].api_key_file: give either"), "{}", err_of(&both));
    }
}
