//! `lockprobe validate`: one full cycle plus every negative check against the given
//! instances, with JUnit XML and JSON reports. The pre-release gate of a library version.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::observer::Observer;
use super::report::CycleReport;
use super::scenario::Scenario;
use super::settings::ProbeSettings;
use super::state::{StateError, StateFile};
use super::target::{check_instance_url, TargetError};

/// Target name used for `validate` in reports, metrics and the state file.
pub const VALIDATE_TARGET: &str = "validate";

/// What `validate` was asked to do.
#[derive(Clone)]
pub struct ValidateOptions {
    /// Instance base URLs (`--endpoint`, repeatable).
    pub endpoints: Vec<String>,
    /// The convergence delay the service is expected to declare (`--expect-convergence`).
    pub expect_convergence: Option<Duration>,
    /// Wait on top of the declared delay (`--buffer`).
    pub buffer: Duration,
    /// Prefix of the test resources (`--test-prefix`).
    pub test_prefix: String,
    /// Lock API key (from `LOCKPROBE_LOCK_API_KEY`).
    pub api_key: String,
    /// Optional state file, so a killed run's locks are released by the next one.
    pub state_file: Option<PathBuf>,
    /// Also run the eager checks (`--eager`).
    pub eager: bool,
    /// Names the run's resources `<prefix>v<run_id>-<i>`; random when unset. The release
    /// gate sets it to look at the resources afterwards.
    pub run_id: Option<String>,
}

/// Why `validate` could not run (as opposed to: ran and found failures).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// Bad flags; the message names the flag.
    #[error("{0}")]
    Usage(String),
    /// The state file could not be used.
    #[error(transparent)]
    State(#[from] StateError),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A report file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Report path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
}

impl ValidateOptions {
    /// Checks the flags; errors name the flag.
    pub fn check(&self) -> Result<(), ValidateError> {
        if self.endpoints.is_empty() {
            return Err(ValidateError::Usage("--endpoint: at least one endpoint is required".into()));
        }
        for e in &self.endpoints {
            check_instance_url(e).map_err(|m| ValidateError::Usage(format!("--endpoint: {m}")))?;
        }
        if self.test_prefix.is_empty() {
            return Err(ValidateError::Usage("--test-prefix: must not be empty".into()));
        }
        if self.api_key.is_empty() {
            return Err(ValidateError::Usage("LOCKPROBE_LOCK_API_KEY: the lock API key must be set".into()));
        }
        Ok(())
    }

    /// Probe settings for a one-shot run: leases long enough for one cycle.
    pub fn settings(&self) -> ProbeSettings {
        ProbeSettings {
            expected_convergence: self.expect_convergence,
            buffer: self.buffer,
            eager: self.eager,
            ..ProbeSettings::short_run(VALIDATE_TARGET, self.endpoints.clone(), self.api_key.clone(), &self.test_prefix)
        }
    }
}

/// Runs the validation and returns its report (`result` tells pass or fail). `cancel`
/// (SIGINT, SIGTERM) stops the cycle early; its locks are released on the way out and the
/// report says the cycle was cancelled.
pub async fn run(
    opts: &ValidateOptions,
    observer: Arc<dyn Observer>,
    cancel: CancellationToken,
) -> Result<CycleReport, ValidateError> {
    opts.check()?;
    let state = Arc::new(match &opts.state_file {
        Some(p) => StateFile::open(p)?,
        None => StateFile::in_memory(),
    });
    let scenario = Scenario::new(opts.settings(), state, observer)?;
    let cleared = scenario.recover().await;
    if cleared > 0 {
        tracing::info!(cleared, "released locks left by a previous validate run");
    }
    // Fresh resources per run, so concurrent or repeated runs never meet each other's locks.
    let run_id = opts.run_id.clone().unwrap_or_else(|| hex::encode(rand::random::<[u8; 4]>()));
    Ok(scenario.run_cycle(&opts.resources(&run_id), cancel).await)
}

impl ValidateOptions {
    /// The test resources a run named `run_id` uses.
    pub fn resources(&self, run_id: &str) -> Vec<String> {
        let count = self.settings().resources_per_cycle();
        (0..count).map(|i| format!("{}v{run_id}-{i}", self.test_prefix)).collect()
    }
}

/// Writes the JUnit XML and JSON reports where asked.
pub fn write_reports(report: &CycleReport, junit: Option<&Path>, json: Option<&Path>) -> Result<(), ValidateError> {
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| ValidateError::Write { path: path.to_path_buf(), source })
    };
    if let Some(p) = junit {
        write(p, report.to_junit())?;
    }
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
        write(p, text)?;
    }
    Ok(())
}
