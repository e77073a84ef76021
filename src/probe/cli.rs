//! The probe's subcommands (`validate`, `serve`, `check-config`): flags, and the glue
//! from flags to the library. Usage errors are [`UsageError`]s (exit 64).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::observer::{PrintObserver, TracingObserver};
use super::report::CycleResult;
use super::runtime::Probe;
use super::state::StateFile;
use super::validate::{self, ValidateError, ValidateOptions};
use super::config::{Config, ConfigError};
use crate::usage::UsageError;

/// Environment variable holding the lock API key for `validate`.
pub const API_KEY_ENV: &str = "LOCKPROBE_LOCK_API_KEY";

/// Flags of `lockprobe validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// Base URL of one instance of the service (repeat for every instance).
    #[arg(long = "endpoint", required = true)]
    pub endpoints: Vec<String>,
    /// Convergence delay the service is expected to declare; a different declaration fails.
    #[arg(long, value_parser = crate::usage::parse_bounded_duration)]
    pub expect_convergence: Option<Duration>,
    /// Wait on top of the declared convergence delay before escalating.
    #[arg(long, value_parser = crate::usage::parse_bounded_duration, default_value = "1s")]
    pub buffer: Duration,
    /// Prefix of the test resources the probe may lock.
    #[arg(long, default_value = "probe-")]
    pub test_prefix: String,
    /// Write a JUnit XML report here (one test case per assertion).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write a JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Record held locks here so a killed run's locks are released by the next run.
    #[arg(long, env = "LOCKPROBE_STATE_FILE")]
    pub state_file: Option<PathBuf>,
}

/// Flags of `lockprobe serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration file.
    #[arg(long)]
    pub config: PathBuf,
}

/// The `check-config` verdict for a configuration that loaded and validated.
pub fn print_config_ok(path: &std::path::Path, config: &Config) {
    println!(
        "{}: ok ({} target{})",
        path.display(),
        config.targets.len(),
        if config.targets.len() == 1 { "" } else { "s" }
    );
}

/// Loads and validates the configuration; problems are usage errors naming the field.
pub fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Config::load(path).map_err(|e| match e {
        ConfigError::Read { .. } => anyhow::Error::new(UsageError::new(e.to_string())),
        other => anyhow::Error::new(UsageError::new(format!("{}: {other}", path.display()))),
    })
}

/// `lockprobe validate`: returns the exit code (0 passed, 1 failed or interrupted by
/// `shutdown`).
pub async fn validate(args: ValidateArgs, shutdown: CancellationToken) -> anyhow::Result<u8> {
    let opts = ValidateOptions {
        endpoints: args.endpoints.clone(),
        expect_convergence: args.expect_convergence,
        buffer: args.buffer,
        test_prefix: args.test_prefix.clone(),
        api_key: std::env::var(API_KEY_ENV).unwrap_or_default(),
        state_file: args.state_file.clone(),
    };
    let report = match validate::run(&opts, Arc::new(PrintObserver), shutdown).await {
        Ok(r) => r,
        Err(ValidateError::Usage(m)) => return Err(UsageError::new(m).into()),
        Err(e) => return Err(e.into()),
    };
    validate::write_reports(&report, args.junit.as_deref(), args.json.as_deref())?;
    let failed: Vec<_> = report.assertions.iter().filter(|a| !a.passed).collect();
    println!();
    if report.result == CycleResult::Passed {
        println!("validate: PASSED ({} assertions)", report.assertions.len());
        return Ok(0);
    }
    println!(
        "validate: {} ({} of {} assertions failed, {} enforcement violations)",
        report.result.as_str().to_uppercase(),
        failed.len(),
        report.assertions.len(),
        report.enforcement_violations()
    );
    if let Some(e) = &report.error {
        println!("  error: {e}");
    }
    for a in failed {
        println!("  {}", a.line());
    }
    Ok(1)
}

/// Runs `probe` on the targets of an already loaded `config` until `shutdown` (the
/// process may have given `probe` more routes to serve).
pub async fn serve_config(args: &ServeArgs, config: Config, probe: Probe, shutdown: CancellationToken) -> anyhow::Result<()> {
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
