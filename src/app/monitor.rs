//! `lockprobe monitor`: the monitor alone, serving its status and metrics; and
//! [`MonitorSection`], what the monitor watches and how, which is both the flags of that
//! command and the `[monitor]` table of a `serve` configuration.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::FromArgMatches;
use prometheus::Registry;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::listen::{ListenArgs, WebArgs};
use super::store::{OpenStoreError, StoreArgs, StoreKind};
use crate::app::usage::UsageError;
use crate::clock::{Clock, SystemClock};
use crate::exposition;
use crate::listener::{self, Limits};
use crate::monitor::{http, Monitor, MonitorConfig, MonitorConfigError};

/// The store to watch and the monitor's settings: the flags of `lockprobe monitor`, and
/// the `[monitor]` table of a `serve` configuration, whose keys are the same flags
/// without their dashes, `_` for `-` (`store`, `cosmos_endpoint`,
/// `monitor_escalation_buffer`, a list for a repeated flag).
///
/// As a table it is read by [`MonitorSection::from_table`] (its environment variables,
/// deprecated spellings and checks included), so a configuration file that holds one
/// parses into a typed, checked section in one pass ([`super::serve::ServeConfig`]).
#[derive(Debug, Clone, PartialEq, clap::Args, Deserialize)]
#[serde(try_from = "toml::Table")]
pub struct MonitorSection {
    /// The store to watch (`--store memory|cosmos` and the `--cosmos-*` flags).
    #[command(flatten)]
    pub store: StoreArgs,
    /// Monitor settings.
    #[command(flatten)]
    pub monitor: MonitorConfig,
}

/// `lockprobe monitor` flags: what to watch and how, and where to serve.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorCommand {
    /// The store and the monitor's settings.
    #[command(flatten)]
    pub section: MonitorSection,
    /// Address serving `/metrics`, `/api/v1/monitor`, `/healthz` and `/readyz` (port 0
    /// picks a free one).
    #[arg(long, default_value = "127.0.0.1:9108")]
    pub listen: SocketAddr,
    /// The listener's bounds.
    #[command(flatten)]
    pub bounds: ListenArgs,
    /// The endpoints' TLS and authentication.
    #[command(flatten)]
    pub web: WebArgs,
}

/// A bad monitor setting as a usage error naming its flag.
fn flag_error(e: MonitorConfigError) -> UsageError {
    UsageError::new(format!("{}: {}", e.flag(), e.reason()))
}

/// Runs the monitor and its HTTP endpoints on `--listen` until `shutdown`.
///
/// `--store` must name the store the services use: the in-memory default would be an
/// empty store of this process, and a monitor over it reports a healthy, idle fleet
/// whatever the real one does. (`serve` and `demo` hand their monitor the store they
/// run on; tests call [`run_on`] with any store.)
pub async fn run(cmd: MonitorCommand, shutdown: CancellationToken) -> anyhow::Result<()> {
    let limits = cmd.bounds.limits()?;
    if cmd.section.store.kind == StoreKind::Memory {
        return Err(UsageError::new(
            "--store: `lockprobe monitor` watches the store the services use: pass --store cosmos and the --cosmos-* flags \
             (the in-memory store would be an empty store of this process, and the monitor would report an idle fleet)",
        )
        .into());
    }
    // Bad flags are usage errors, reported before the port is taken.
    cmd.section.monitor.validate().map_err(flag_error)?;
    let listener =
        tokio::net::TcpListener::bind(cmd.listen).await.with_context(|| format!("binding --listen {}", cmd.listen))?;
    serve(cmd.section, listener, limits, &cmd.web, shutdown).await
}

/// Like [`run`], on a listener the caller bound (`--listen` is ignored), so a test
/// can bind port 0 and know the port without giving it back first. Any store is taken,
/// the in-memory one included (tests, embedders that fill it themselves).
pub async fn run_on(
    cmd: MonitorCommand,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    cmd.section.monitor.validate().map_err(flag_error)?;
    let limits = cmd.bounds.limits()?;
    serve(cmd.section, listener, limits, &cmd.web, shutdown).await
}

async fn serve(
    section: MonitorSection,
    listener: tokio::net::TcpListener,
    limits: Limits,
    web: &WebArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let registry = Registry::new();
    exposition::register_process_metrics(&registry)?;
    let guards = web.guards(&registry, shutdown.clone())?;
    // `memory` only through `run_on` (tests): an empty store of this process.
    let store = section
        .store
        .open(clock.clone(), std::time::Duration::ZERO, &registry)
        .await
        .map_err(OpenStoreError::into_anyhow)?;
    let monitor = Arc::new(Monitor::new(store, clock, section.monitor, &registry)?);
    let app = http::router(monitor.clone())
        .merge(http::health_router(monitor.clone()))
        .route(exposition::PATH, exposition::route(registry));
    let scheme = if guards.tls_now() { "https" } else { "http" };
    println!("lockprobe monitor: listening on {scheme}://{}", listener.local_addr()?);
    let serve = listener::serve(listener, guards, app, limits, shutdown.clone());
    let (_, served) = tokio::join!(monitor.run(shutdown.clone()), serve);
    served.context("serving the monitor's endpoints")
}

impl TryFrom<toml::Table> for MonitorSection {
    type Error = UsageError;

    fn try_from(table: toml::Table) -> Result<Self, UsageError> {
        Self::from_table(&table)
    }
}

/// The command line a `[monitor]` table stands for, and the command that parses it.
struct TableArgs {
    /// The section's flags; the environment variables of the file's keys are taken off.
    command: clap::Command,
    /// One `--flag=value` per value in the file.
    argv: Vec<String>,
}

impl TableArgs {
    /// Turns each key into its flag (`cosmos_endpoint` → `--cosmos-endpoint`), a list into
    /// the flag repeated, and `true` into a switch; `false` leaves a switch off.
    fn of(table: &toml::Table) -> Result<Self, UsageError> {
        let mut command = <MonitorSection as clap::Args>::augment_args(clap::Command::new("[monitor]"))
            .no_binary_name(true)
            .disable_help_flag(true);
        let mut argv = Vec::new();
        for (written, value) in table {
            let key = written.replace('-', "_");
            if key != *written {
                tracing::warn!(key = %written, use_instead = %key, "deprecated kebab-case key in [monitor]");
            }
            let long = key.replace('_', "-");
            let Some(arg) = command.get_arguments().find(|a| a.get_long() == Some(long.as_str())) else {
                return Err(UsageError::new(format!(
                    "[monitor] unknown key {written:?} (keys are the `lockprobe monitor` flags without their dashes, `_` for `-`: store, cosmos_endpoint, monitor_escalation_buffer, ...)"
                )));
            };
            let switch = !arg.get_action().takes_values();
            let id = arg.get_id().clone();
            // A key in the file wins over its variable: the flag reads none.
            command = command.mut_arg(id, |a| a.env(None::<&'static str>));
            let values = match value {
                toml::Value::Array(items) if !switch => items.iter().collect(),
                other => vec![other],
            };
            for value in values {
                let text = match (value, switch) {
                    (toml::Value::Boolean(true), true) => Some(format!("--{long}")),
                    (toml::Value::Boolean(false), true) => None,
                    (_, true) => {
                        return Err(UsageError::new(format!("[monitor] {key}: {value} is not true or false")));
                    }
                    (toml::Value::String(s), false) => Some(format!("--{long}={s}")),
                    (toml::Value::Integer(n), false) => Some(format!("--{long}={n}")),
                    (_, false) => {
                        return Err(UsageError::new(format!(
                            "[monitor] {key}: {value} is not a value this key takes (a string, a number, or a list of them for a repeated flag)"
                        )));
                    }
                };
                argv.extend(text);
            }
        }
        Ok(Self { command, argv })
    }

    /// Parses the flags: the file's values, else the variables, else the defaults. A
    /// refusal names the key (and the flag, in clap's words); each value taken from a
    /// variable is logged. Returns the section and the settings taken from a variable,
    /// as (key, variable).
    fn parse(self) -> Result<(MonitorSection, Vec<(String, String)>), UsageError> {
        let matches = self.command.clone().try_get_matches_from(self.argv).map_err(|e| {
            let flag = match e.get(clap::error::ContextKind::InvalidArg) {
                Some(clap::error::ContextValue::String(arg)) => arg.split(' ').next().unwrap_or_default().to_owned(),
                _ => String::new(),
            };
            let key = flag.trim_start_matches("--").replace('-', "_");
            // The file's keys had their variable taken off, so a flag that still has one
            // was refused for its variable's value.
            let variable = self
                .command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.trim_start_matches("--")))
                .and_then(|a| a.get_env())
                .map(|env| from_variable(&key, &env.to_string_lossy()))
                .unwrap_or_default();
            let said = clap_words(&e);
            if key.is_empty() {
                UsageError::new(format!("[monitor] {said}"))
            } else {
                UsageError::new(format!("[monitor] {key}: {said}{variable}"))
            }
        })?;
        let mut from_environment = Vec::new();
        for arg in self.command.get_arguments() {
            if matches.value_source(arg.get_id().as_str()) == Some(clap::parser::ValueSource::EnvVariable) {
                let key = arg.get_long().unwrap_or_default().replace('-', "_");
                let env = arg.get_env().map(|v| v.to_string_lossy().into_owned()).unwrap_or_default();
                tracing::info!(%key, %env, "[monitor] setting taken from the environment; a key in the file wins");
                from_environment.push((key, env));
            }
        }
        let section =
            MonitorSection::from_arg_matches(&matches).map_err(|e| UsageError::new(format!("[monitor] {e}")))?;
        Ok((section, from_environment))
    }
}

/// What a refusal of `key`'s value adds when the value came from `env`, its variable: a
/// reader would otherwise look for the key in the file.
fn from_variable(key: &str, env: &str) -> String {
    format!(" (from the environment variable {env}: the file sets no {key})")
}

/// clap's words for `e` without its advice to a command line's user (usage, `--help`,
/// tips): a file has no command line.
fn clap_words(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let said = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect::<Vec<_>>()
        .join(" ");
    said.trim_start_matches("error: ").to_owned()
}

impl MonitorSection {
    /// Reads and validates a `[monitor]` table; errors name the key.
    ///
    /// The table is read as the command line it stands for, by the very flags of
    /// `lockprobe monitor`, so a key cannot differ from its flag in name, parser or
    /// default. Precedence: a key in the file wins; a key the file leaves out takes its
    /// flag's environment variable (`LOCKPROBE_COSMOS_*`, `LOCKPROBE_MONITOR_*`), logged,
    /// and else its default. Kebab-case keys (`cosmos-endpoint`, the form before 0.2) are
    /// still read, with a warning naming their new spelling.
    pub fn from_table(table: &toml::Table) -> Result<Self, UsageError> {
        let (section, from_environment) = TableArgs::of(table)?.parse()?;
        section.validate().map_err(|UsageError(mut said)| {
            // A setting the file does not hold came from its variable: say so, or the
            // reader looks for it in the file.
            let origin = from_environment.iter().find(|(key, _)| said.starts_with(&format!("[monitor] {key}:")));
            if let Some((key, env)) = origin {
                said.push_str(&from_variable(key, env));
            }
            UsageError(said)
        })?;
        Ok(section)
    }

    /// Checks what the table says: a store the services share, usable settings.
    fn validate(&self) -> Result<(), UsageError> {
        if self.store.kind == StoreKind::Memory {
            return Err(UsageError::new(
                "[monitor] store: \"memory\" would watch an empty store of this process; name the store the services use (store = \"cosmos\")",
            ));
        }
        self.store.validate().map_err(|e| UsageError::new(format!("[monitor] {}: {e}", e.key())))?;
        self.monitor.validate().map_err(|e| UsageError::new(format!("[monitor] {}: {}", e.key(), e.reason())))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn a_cosmos_section_parses_with_repeated_and_human_values() {
        // A variable of this test's own, so no other test races on it.
        std::env::set_var("LOCKPROBE_TEST_SERVE_SECTION_KEY", "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        let section = MonitorSection::from_table(&table(
            r#"
            store = "cosmos"
            cosmos_endpoint = "https://acct.documents.azure.com:443/"
            cosmos_key_env = "LOCKPROBE_TEST_SERVE_SECTION_KEY"
            cosmos_database = "routing"
            cosmos_container = "locations"
            cosmos_write_region = "westeurope"
            cosmos_preferred_region = ["westeurope", "northeurope"]
            cosmos_create_if_missing = false
            monitor_escalation_buffer = "90s"
            "#,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(section.store.kind, StoreKind::Cosmos);
        assert_eq!(section.store.cosmos.preferred_regions, ["westeurope", "northeurope"]);
        assert_eq!(section.monitor.escalation_buffer, Duration::from_secs(90));
        assert_eq!(section.monitor.scan_interval, MonitorConfig::default().scan_interval);
    }

    #[test]
    fn kebab_case_keys_are_still_read() {
        std::env::set_var("LOCKPROBE_TEST_SERVE_KEBAB_KEY", "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        let section = MonitorSection::from_table(&table(
            r#"
            store = "cosmos"
            cosmos-endpoint = "https://acct.documents.azure.com:443/"
            cosmos-key-env = "LOCKPROBE_TEST_SERVE_KEBAB_KEY"
            cosmos-database = "routing"
            cosmos-container = "locations"
            cosmos-write-region = "westeurope"
            monitor-escalation-buffer = "90s"
            "#,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(section.store.cosmos.database.as_deref(), Some("routing"));
        assert_eq!(section.monitor.escalation_buffer, Duration::from_secs(90));
    }

    #[test]
    fn bad_sections_name_the_key() {
        let unknown = MonitorSection::from_table(&table("store = \"cosmos\"\ncosmos_endpoit = \"x\"")).unwrap_err();
        assert!(unknown.0.contains("cosmos_endpoit"), "{unknown}");
        let memory = MonitorSection::from_table(&table(r#"store = "memory""#)).unwrap_err();
        assert!(memory.0.contains("store"), "{memory}");
        let missing = MonitorSection::from_table(&table(r#"store = "cosmos""#)).unwrap_err();
        assert!(missing.0.contains("cosmos_endpoint") && missing.0.contains("--cosmos-endpoint"), "{missing}");
        let bad = MonitorSection::from_table(&table(
            "store = \"cosmos\"\ncosmos_endpoint = \"https://a.example/\"\ncosmos_key_env = \"PATH\"\ncosmos_write_region = \"w\"\nmonitor_scan_interval = \"soon\"",
        ))
        .unwrap_err();
        assert!(bad.0.contains("monitor_scan_interval"), "{bad}");
        std::env::set_var("LOCKPROBE_TEST_SERVE_ZERO_KEY", "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        let zero = MonitorSection::from_table(&table(
            "store = \"cosmos\"\ncosmos_endpoint = \"https://a.example/\"\ncosmos_key_env = \"LOCKPROBE_TEST_SERVE_ZERO_KEY\"\ncosmos_database = \"d\"\ncosmos_container = \"c\"\ncosmos_write_region = \"w\"\nmonitor_sweep_interval = \"0s\"",
        ))
        .unwrap_err();
        assert!(zero.0.contains("monitor_sweep_interval: must be positive"), "{zero}");
    }

    /// Every test's own variable, so no other test races on it.
    fn key_variable(name: &str) -> String {
        std::env::set_var(name, "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        name.to_owned()
    }

    fn cosmos(key_env: &str, rest: &str) -> toml::Table {
        table(&format!(
            "store = \"cosmos\"\ncosmos_endpoint = \"https://a.example/\"\ncosmos_key_env = \"{key_env}\"\ncosmos_database = \"d\"\ncosmos_container = \"c\"\n{rest}"
        ))
    }

    #[test]
    fn a_table_and_the_flags_are_two_views_of_one_type() {
        let key_env = key_variable("LOCKPROBE_TEST_SERVE_VIEWS_KEY");
        let from_table = MonitorSection::from_table(&cosmos(
            &key_env,
            "cosmos_preferred_region = [\"a\", \"b\"]\ncosmos_create_if_missing = true\nmonitor_poll_interval = \"3s\"\ncosmos_poll_interval = \"4s\"\nmonitor_declared_delay = \"2h\"\nmonitor_poll_batch = 7\ncosmos_change_stream = \"change-feed\"",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            section: MonitorSection,
        }
        let flags = [
            "lockprobe",
            "--store=cosmos",
            "--cosmos-endpoint=https://a.example/",
            "--cosmos-key-env=LOCKPROBE_TEST_SERVE_VIEWS_KEY",
            "--cosmos-database=d",
            "--cosmos-container=c",
            "--cosmos-preferred-region=a",
            "--cosmos-preferred-region=b",
            "--cosmos-create-if-missing",
            "--monitor-poll-interval=3s",
            "--cosmos-poll-interval=4s",
            "--monitor-declared-delay=2h",
            "--monitor-poll-batch=7",
            "--cosmos-change-stream=change-feed",
        ];
        let from_flags = <Cli as clap::Parser>::try_parse_from(flags).unwrap().section;
        assert_eq!(from_table, from_flags);
        // The two poll intervals, one per part, are told apart.
        assert_eq!(from_table.monitor.poll_interval, Duration::from_secs(3));
        assert_eq!(from_table.store.cosmos.poll_interval, Duration::from_secs(4));
        assert!(from_table.store.cosmos.create_if_missing);
    }

    #[test]
    fn values_of_the_wrong_shape_name_the_key() {
        let key_env = key_variable("LOCKPROBE_TEST_SERVE_SHAPE_KEY");
        for (rest, key) in [
            ("cosmos_create_if_missing = \"yes\"", "cosmos_create_if_missing"),
            ("monitor_poll_batch = 1.5", "monitor_poll_batch"),
            ("monitor_poll_batch = \"many\"", "monitor_poll_batch"),
            ("monitor_lapse_grace = \"500000years\"", "monitor_lapse_grace"),
            ("cosmos_write_region = [\"a\", \"b\"]", "cosmos_write_region"),
            ("cosmos_preferred_region = [[\"a\"]]", "cosmos_preferred_region"),
            ("cosmos_auth = \"password\"", "cosmos_auth"),
            ("monitor_scan_interval = { every = \"5m\" }", "monitor_scan_interval"),
        ] {
            let err = MonitorSection::from_table(&cosmos(&key_env, rest)).unwrap_err();
            assert!(err.0.starts_with(&format!("[monitor] {key}")), "{rest}: {err}");
            assert!(!err.0.contains("environment variable"), "the file's value, not a variable's: {err}");
        }
        let twice = table("cosmos_endpoint = \"https://a.example/\"\ncosmos-endpoint = \"https://b.example/\"");
        let err = MonitorSection::from_table(&twice).unwrap_err();
        assert!(err.0.contains("cosmos_endpoint"), "one key spelled twice is refused: {err}");
    }
}
