//! `lockprobe serve` and `check-config`: the probe on its schedules and, when the
//! configuration has a `[monitor]` table, the convergence monitor over the routing store
//! that table names, in one process with one `/metrics`.
//!
//! The `[monitor]` keys are exactly the `lockprobe monitor` flags without their leading
//! dashes, so both are parsed and validated by the same code:
//!
//! ```toml
//! [monitor]
//! store = "cosmos"
//! cosmos-endpoint = "https://routing.documents.azure.com:443/"
//! cosmos-key-env = "ROUTING_COSMOS_KEY"
//! cosmos-database = "routing"
//! cosmos-container = "locations"
//! cosmos-write-region = "westeurope"
//! cosmos-preferred-region = ["westeurope", "northeurope"]
//! monitor-escalation-buffer = "10m"
//! monitor-declared-delay = "2h"
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::monitor::args::MonitorArgs;
use crate::monitor::{http as monitor_http, Monitor};
use crate::probe::config::{Config, ConfigError};
use crate::probe::observer::TracingObserver;
use crate::probe::runtime::Probe;
use crate::probe::state::StateFile;
use super::store::{OpenStoreError, StoreArgs, StoreKind};
use crate::usage::UsageError;

/// Flags of `lockprobe serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration file.
    #[arg(long)]
    pub config: PathBuf,
}

/// The `[monitor]` table, parsed as the `lockprobe monitor` flags.
#[derive(Debug, Clone, Parser)]
#[command(name = "[monitor]", no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
pub struct MonitorSection {
    /// The store to watch.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Monitor settings.
    #[command(flatten)]
    pub monitor: MonitorArgs,
}

impl MonitorSection {
    /// Parses and validates the table; errors name the key.
    pub fn from_table(table: &toml::Table) -> Result<Self, UsageError> {
        let mut argv = Vec::new();
        for (key, value) in table {
            let flag = format!("--{key}");
            match value {
                toml::Value::String(s) => argv.extend([flag, s.clone()]),
                toml::Value::Integer(i) => argv.extend([flag, i.to_string()]),
                toml::Value::Boolean(true) => argv.push(flag),
                toml::Value::Boolean(false) => {}
                toml::Value::Array(items) => {
                    for item in items {
                        let toml::Value::String(s) = item else {
                            return Err(UsageError::new(format!("[monitor] {key}: expected a list of strings")));
                        };
                        argv.extend([flag.clone(), s.clone()]);
                    }
                }
                other => return Err(UsageError::new(format!("[monitor] {key}: unsupported value {other}"))),
            }
        }
        let section = Self::try_parse_from(argv)
            .map_err(|e| UsageError::new(format!("[monitor] (keys are the `lockprobe monitor` flags without dashes): {}", e.render().to_string().trim())))?;
        if section.store.kind == StoreKind::Memory {
            return Err(UsageError::new(
                "[monitor] store: \"memory\" would watch an empty store of this process; name the store the services use (store = \"cosmos\")",
            ));
        }
        section.store.validate().map_err(|e| UsageError::new(format!("[monitor] {e}")))?;
        section.monitor.to_config().map_err(|e| UsageError::new(format!("[monitor] {e}")))?;
        Ok(section)
    }
}

/// Loads and validates the configuration; problems are usage errors naming the field.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    Config::load(path).map_err(|e| match e {
        ConfigError::Read { .. } => anyhow::Error::new(UsageError::new(e.to_string())),
        other => anyhow::Error::new(UsageError::new(format!("{}: {other}", path.display()))),
    })
}

/// `lockprobe check-config FILE`: the probe targets and the `[monitor]` table.
pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let config = load(path)?;
    if let Some(table) = &config.monitor {
        MonitorSection::from_table(table).map_err(|e| UsageError::new(format!("{}: {e}", path.display())))?;
    }
    println!(
        "{}: ok ({} target{})",
        path.display(),
        config.targets.len(),
        if config.targets.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

/// `lockprobe serve --config FILE`: runs until `shutdown`.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = load(&args.config)?;
    let mut probe = Probe::new()?;
    if let Some(table) = &config.monitor {
        let section = MonitorSection::from_table(table).map_err(|e| UsageError::new(format!("{}: {e}", args.config.display())))?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let registry = probe.metrics.registry();
        let store = section.store.open(clock.clone(), std::time::Duration::ZERO, registry).await.map_err(OpenStoreError::into_anyhow)?;
        let monitor_config = section.monitor.to_config().map_err(|e| UsageError::new(e.to_string()))?;
        let monitor = Arc::new(Monitor::new(store, clock, monitor_config, registry)?);
        tokio::spawn(monitor.clone().run(shutdown.clone()));
        probe.extra_routes = Some(monitor_http::router(monitor));
        tracing::info!("convergence monitor running");
    }
    serve_config(&args, config, probe, shutdown).await
}

/// Runs `probe` on the targets of an already loaded `config` until `shutdown` (the
/// process may have given `probe` more routes to serve).
async fn serve_config(args: &ServeArgs, config: Config, probe: Probe, shutdown: CancellationToken) -> anyhow::Result<()> {
    let targets = config
        .probe_targets()
        .map_err(|e| UsageError::new(format!("{}: {e}", args.config.display())))?;
    let state = Arc::new(StateFile::open(&config.state_file)?);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(addr = %listener.local_addr()?, targets = targets.len(), "probe http server listening");
    probe
        .run(
            targets,
            state,
            Arc::new(TracingObserver),
            listener,
            None,
            shutdown,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
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
            cosmos-endpoint = "https://acct.documents.azure.com:443/"
            cosmos-key-env = "LOCKPROBE_TEST_SERVE_SECTION_KEY"
            cosmos-database = "routing"
            cosmos-container = "locations"
            cosmos-write-region = "westeurope"
            cosmos-preferred-region = ["westeurope", "northeurope"]
            monitor-escalation-buffer = "90s"
            "#,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(section.store.kind, StoreKind::Cosmos);
        assert_eq!(section.monitor.escalation_buffer, std::time::Duration::from_secs(90));
    }

    #[test]
    fn bad_sections_name_the_key() {
        let unknown = MonitorSection::from_table(&table(r#"store = "cosmos"
cosmos-endpoit = "x""#)).unwrap_err();
        assert!(unknown.0.contains("cosmos-endpoit"), "{unknown}");
        let memory = MonitorSection::from_table(&table(r#"store = "memory""#)).unwrap_err();
        assert!(memory.0.contains("store"), "{memory}");
        let missing = MonitorSection::from_table(&table(r#"store = "cosmos""#)).unwrap_err();
        assert!(missing.0.contains("--cosmos-endpoint"), "{missing}");
        let bad = MonitorSection::from_table(&table(
            r#"store = "cosmos"
cosmos-endpoint = "https://a.example/"
cosmos-key-env = "PATH"
cosmos-write-region = "w"
monitor-scan-interval = "soon""#,
        ))
        .unwrap_err();
        assert!(bad.0.contains("monitor-scan-interval"), "{bad}");
    }
}
