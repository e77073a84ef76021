//! `lockprobe serve` and `check-config`: the probe on its schedules and, when the
//! configuration has a `[monitor]` table, the convergence monitor over the routing store
//! that table names, in one process with one `/metrics`.
//!
//! The `[monitor]` table and the `lockprobe monitor` flags are two views of one type,
//! [`MonitorSection`]: each key is a flag without its dashes, `_` for `-`. A key in the
//! file wins over the flag's environment variable, which fills only keys the file
//! leaves out:
//!
//! ```toml
//! [monitor]
//! store = "cosmos"
//! cosmos_endpoint = "https://routing.documents.azure.com:443/"
//! cosmos_key_env = "ROUTING_COSMOS_KEY"
//! cosmos_database = "routing"
//! cosmos_container = "locations"
//! cosmos_write_region = "westeurope"
//! cosmos_preferred_region = ["westeurope", "northeurope"]
//! monitor_escalation_buffer = "10m"
//! monitor_declared_delay = "2h"
//! ```
//!
//! SIGHUP and, with `--web.enable-lifecycle`, `POST /-/reload` re-read the file
//! (`crate::probe::engine::reloader::ConfigReloader`): targets are
//! compared by name and by every field (and the key their variable holds); `listen`
//! (unless `--listen` overrides it), `state_file`, `max_concurrent_cycles` and the
//! `[monitor]` table need a restart, and a reload that changes them is refused, as is a file that does not load.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::listen::{ListenArgs, WebArgs};
use super::monitor::MonitorSection;
use super::store::OpenStoreError;
use super::tasks::{Background, GRACE};
use crate::app::usage::UsageError;
use crate::clock::{Clock, SystemClock};
use crate::monitor::{http as monitor_http, Monitor};
use crate::probe::checks::observer::TracingObserver;
use crate::probe::checks::settings::RESOURCES_PER_CYCLE;
use crate::probe::checks::state::StateFile;
use crate::probe::engine::config::{Config, ConfigError};
use crate::probe::engine::reload::{Reload, ReloadMetrics};
use crate::probe::engine::reloader::ConfigReloader;
use crate::probe::engine::runtime::{target_control, Probe};
use crate::probe::engine::scheduler::{
    uses_per_group, TargetSchedule, DEFAULT_KEY_WINDOW, RECORDS_PER_CYCLE, SERVICE_KEYED_RECORDS,
};

/// Flags of `lockprobe serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// Address of the HTTP server (`/metrics`, `/healthz`, `/readyz`, status): overrides
    /// the config's `listen` (whose default is 127.0.0.1:9464), e.g. `0.0.0.0:9464` in
    /// a container without editing the mounted config.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// The HTTP server's bounds.
    #[command(flatten)]
    pub bounds: ListenArgs,
    /// Serve `POST /-/reload` (off by default, as in Prometheus: anyone who can reach
    /// the port could make the process re-read its file). SIGHUP reloads either way.
    #[arg(long = "web.enable-lifecycle")]
    pub enable_lifecycle: bool,
    /// The HTTP server's TLS and authentication.
    #[command(flatten)]
    pub web: WebArgs,
}

/// `serve`'s configuration file: the probe's targets and, typed, the monitor's table.
pub type ServeConfig = Config<MonitorSection>;

/// Loads and validates the configuration, the `[monitor]` table included; problems are
/// usage errors naming the field.
pub fn load(path: &Path) -> anyhow::Result<ServeConfig> {
    ServeConfig::load(path).map_err(|e| match e {
        ConfigError::Read { .. } => anyhow::Error::new(UsageError::new(e.to_string())),
        other => anyhow::Error::new(UsageError::new(format!("{}: {other}", path.display()))),
    })
}

/// Refuses a `state_file` the probe could not journal its locks in (a directory that
/// cannot be written, missing, or something other than a file where each write puts its
/// temporary copy): a usage error naming the field, before anything runs.
fn check_state_file(path: &Path, config: &ServeConfig) -> anyhow::Result<()> {
    StateFile::check_writable(&config.state_file).map_err(|e| {
        anyhow::Error::new(UsageError::new(format!(
            "{}: state_file: cannot be written, and the probe journals every lock there before taking it: {e}",
            path.display()
        )))
    })
}

/// `lockprobe check-config FILE`: the probe targets, the `[monitor]` table and the state
/// file's place. A configuration is often checked on another host than the one that runs
/// it (a CI job, a laptop): a state file directory that does not exist here is named in a
/// note, not refused (`serve` refuses it where it runs); one that exists and cannot be
/// written is refused.
pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let config = load(path)?;
    // What `serve` builds at start, every target's lock API key included (from its
    // variable, read now, or its file, read by `load`): a key `serve` would refuse is
    // refused here too.
    let targets = config.probe_targets().map_err(|e| UsageError::new(format!("{}: {e}", path.display())))?;
    for (_, target) in &targets {
        note_key_window(path, target);
    }
    let directory = match config.state_file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if directory.is_dir() {
        check_state_file(path, &config)?;
    } else {
        println!(
            "{}: note: state_file: the directory {} does not exist on this host; `lockprobe serve` refuses to start until it does",
            path.display(),
            directory.display()
        );
    }
    println!(
        "{}: ok ({} target{}; checked: every field, each target's lock API key{}{})",
        path.display(),
        config.targets.len(),
        if config.targets.len() == 1 { "" } else { "s" },
        if config.monitor.is_some() { ", the [monitor] store's settings and key" } else { "" },
        if directory.is_dir() { ", the state file's place" } else { "" },
    );
    Ok(())
}

/// A note (not a refusal: the window is the service's) when `target` would reuse a group
/// of its pool more often within a contract-1.3 service's default key window than the
/// service keeps records for: its lock calls would then be refused with 429
/// `idempotency-records-full` (docs/probe.md, "Redundancy").
fn note_key_window(path: &Path, target: &TargetSchedule) {
    let Some(uses) = uses_per_group(target, chrono::Utc::now(), DEFAULT_KEY_WINDOW) else { return };
    let allowed = u64::from(SERVICE_KEYED_RECORDS / RECORDS_PER_CYCLE);
    if uses > allowed {
        println!(
            "{}: note: targets {:?}: schedule and pool_size: each group of {} resources is used about {uses} times in 48 h, \
             leaving about {} records of keyed lock calls on a resource a contract-1.3 service keeps at most {SERVICE_KEYED_RECORDS} of \
             for that long (its default maximum pre-lock): expect 429 idempotency-records-full; use at most {allowed} times a group \
             (a larger pool_size or a longer schedule)",
            path.display(),
            target.name,
            RESOURCES_PER_CYCLE,
            uses * u64::from(RECORDS_PER_CYCLE),
        );
    }
}

/// `lockprobe serve --config FILE`: runs until `shutdown`; SIGHUP reloads the config.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    // First of all: SIGHUP's default action ends the process.
    let hangups = Hangups::listen()?;
    args.bounds.limits()?;
    let config = load(&args.config)?;
    check_state_file(&args.config, &config)?;
    let mut probe = Probe::new()?;
    probe.guards = args.web.guards(probe.metrics.registry(), shutdown.clone())?;
    // The monitor runs beside the probe, on the tracker, and stops after it.
    let background = Background::new();
    if let Some(section) = config.monitor.clone() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let registry = probe.metrics.registry();
        let store = section
            .store
            .open(clock.clone(), std::time::Duration::ZERO, registry)
            .await
            .map_err(OpenStoreError::into_anyhow)?;
        let monitor = Arc::new(Monitor::new(store, clock, section.monitor, registry)?);
        background.spawn("monitor", monitor.clone().run(background.token()));
        probe.extra_routes = Some(monitor_http::router(monitor));
        tracing::info!("convergence monitor running");
    }
    let served = serve_config(&args, config, probe, hangups, shutdown).await;
    background.stop(GRACE).await;
    served
}

/// Runs `probe` on the targets of an already loaded `config` until `shutdown` (the
/// process may have given `probe` more routes to serve), reloading on `hangups`.
async fn serve_config(
    args: &ServeArgs,
    config: ServeConfig,
    mut probe: Probe,
    hangups: Hangups,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let targets = config.probe_targets().map_err(|e| UsageError::new(format!("{}: {e}", args.config.display())))?;
    probe.max_concurrent_cycles = config.max_concurrent_cycles;
    probe.limits = args.bounds.limits()?;
    let state = Arc::new(StateFile::open(&config.state_file)?);
    let listen = args.listen.unwrap_or(config.listen);
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(addr = %listener.local_addr()?, targets = targets.len(), "probe http server listening");
    let (control, inbox) = target_control();
    let metrics = ReloadMetrics::new(probe.metrics.registry())?;
    let reloader: Arc<dyn Reload> = Arc::new(ConfigReloader::new(
        args.config.clone(),
        args.listen.is_some(),
        config,
        &targets,
        control,
        shutdown.clone(),
        metrics,
    ));
    if args.enable_lifecycle {
        probe.reload = Some(reloader.clone());
    }
    let on_hangup = tokio::spawn(hangups.reload_each(reloader, shutdown.clone()));
    let run =
        probe.run_controlled(targets, state, Arc::new(TracingObserver), listener, None, shutdown.clone(), Some(inbox));
    let result = run.await;
    // The run also ends when its server fails: stop taking SIGHUPs either way.
    on_hangup.abort();
    result?;
    Ok(())
}

/// SIGHUP, caught from the start of `serve` so that it never ends the process.
struct Hangups(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangups {
    fn listen() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("listening for SIGHUP")?;
            Ok(Self(signal))
        }
        #[cfg(not(unix))]
        Ok(Self())
    }

    /// Reloads on every SIGHUP until `shutdown`; the reloader logs the outcome.
    async fn reload_each(self, reloader: Arc<dyn Reload>, shutdown: CancellationToken) {
        #[cfg(unix)]
        {
            let mut signal = self.0;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    got = signal.recv() => {
                        if got.is_none() {
                            break;
                        }
                        tracing::info!("SIGHUP: reloading the configuration");
                        let _ = reloader.reload().await;
                    }
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = (self, reloader);
            shutdown.cancelled().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::app::store::StoreKind;

    const TARGET: &str = r#"
[[targets]]
name = "demo"
instances = ["http://127.0.0.1:8080"]
test_prefix = "probe-"
cache_ttl = "1s"
replication_bound = "1s"
schedule = "*/10 * * * * *"
timeout = "2h"
"#;

    fn monitor(key_env: &str, extra: &str) -> String {
        format!(
            "[monitor]\nstore = \"cosmos\"\ncosmos_endpoint = \"https://acct.documents.azure.com:443/\"\n\
             cosmos_key_env = \"{key_env}\"\ncosmos_database = \"routing\"\ncosmos_container = \"locations\"\n\
             cosmos_write_region = \"westeurope\"\n{extra}"
        )
    }

    #[test]
    fn the_monitor_table_is_read_typed_and_checked_with_the_file() {
        std::env::set_var("LOCKPROBE_TEST_SERVE_CONFIG_KEY", "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        let text =
            format!("{TARGET}{}", monitor("LOCKPROBE_TEST_SERVE_CONFIG_KEY", "monitor_escalation_buffer = \"90s\""));
        let config: ServeConfig = text.parse().unwrap_or_else(|e| panic!("{e}"));
        let section = config.monitor.expect("a [monitor] table");
        assert_eq!(section.store.kind, StoreKind::Cosmos);
        assert_eq!(section.monitor.escalation_buffer, Duration::from_secs(90));

        // The same settings spelled the old way are the same section: a reload that only
        // respells them changes nothing.
        let kebab = text.replace("monitor_escalation_buffer", "monitor-escalation-buffer");
        let respelled: ServeConfig = kebab.parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(respelled.monitor, Some(section));

        // No table, no monitor.
        assert!(TARGET.parse::<ServeConfig>().unwrap().monitor.is_none());
    }

    #[test]
    fn a_bad_monitor_table_fails_the_load_naming_its_line_and_key() {
        std::env::set_var("LOCKPROBE_TEST_SERVE_CONFIG_BAD_KEY", "c2VjcmV0LWtleS1mb3ItdGVzdHM=");
        for (extra, named) in [
            ("monitor_scan_intervall = \"5m\"", "monitor_scan_intervall"),
            ("monitor_sweep_interval = \"0s\"", "monitor_sweep_interval: must be positive"),
        ] {
            let text = format!("{TARGET}{}", monitor("LOCKPROBE_TEST_SERVE_CONFIG_BAD_KEY", extra));
            let error = text.parse::<ServeConfig>().unwrap_err().to_string();
            assert!(error.contains(named), "{error}");
            assert!(error.contains("line 10"), "the table's line: {error}");
        }
    }
}
