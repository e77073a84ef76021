//! `lockprobe validate`: one full cycle plus every negative check against the given
//! instances, with JUnit XML and JSON reports. The pre-release gate of a library version.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::probe::checks::credentials::TargetTls;
use crate::probe::checks::observer::Observer;
use crate::probe::checks::report::CycleReport;
use crate::probe::checks::report::CycleResult;
use crate::probe::checks::scenario::Scenario;
use crate::probe::checks::settings::{
    check_max_inconclusive, AdminKeys, Leases, ProbeSettings, DEFAULT_MAX_INCONCLUSIVE,
};
use crate::probe::checks::state::{StateError, StateFile};
use crate::probe::checks::target::{check_instance_url, TargetError};

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
    /// Lock API key (from `--api-key-file` or `LOCKPROBE_LOCK_API_KEY`).
    pub api_key: String,
    /// Extra CA roots and client identity for `https` endpoints (`--ca-file`,
    /// `--client-cert`, `--client-key`).
    pub tls: TargetTls,
    /// Optional state file, so a killed run's locks are released by the next one.
    pub state_file: Option<PathBuf>,
    /// The two locations the cycle swaps between (`--location`, twice).
    pub locations: Vec<String>,
    /// Lease lengths per phase (`--pre-lock-lease`, `--hard-delete-lease`,
    /// `--write-lease`, `--short-write-lease`).
    pub leases: Leases,
    /// Timeout of one HTTP request (`--request-timeout`).
    pub request_timeout: Duration,
    /// The whole run ends by then (`--deadline`): the cycle is cancelled, its locks
    /// released, and the report says the deadline ran out.
    pub deadline: Option<Duration>,
    /// Also run the eager checks (`--eager`).
    pub eager: bool,
    /// The two admin principals' keys (`--admin-key-file`, twice): when given, the
    /// force-release check runs too.
    pub admin_keys: Option<(String, String)>,
    /// Names the run's resources `<prefix>v<run_id>-<i>`; random when unset. The release
    /// gate sets it to look at the resources afterwards.
    pub run_id: Option<String>,
    /// The largest share of a check's operations that may be inconclusive
    /// (`--max-inconclusive`).
    pub max_inconclusive: f64,
    /// The wall clock the probe reads (the system's; a test gives one that steps).
    pub clock: Arc<dyn Clock>,
}

impl Default for ValidateOptions {
    /// The flags' defaults, with no endpoint and no key.
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            expect_convergence: None,
            buffer: Duration::from_secs(1),
            test_prefix: "probe-".into(),
            api_key: String::new(),
            tls: TargetTls::default(),
            state_file: None,
            locations: vec!["westeurope".into(), "northeurope".into()],
            leases: Leases::short_run(),
            request_timeout: Duration::from_secs(10),
            deadline: None,
            eager: false,
            admin_keys: None,
            run_id: None,
            max_inconclusive: DEFAULT_MAX_INCONCLUSIVE,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Characters the contract refuses in ids and location names (Cosmos DB forbids the
/// first four in document ids).
const FORBIDDEN_IN_NAMES: [char; 4] = ['/', '\\', '?', '#'];

/// Longest location name the contract accepts, in bytes.
const MAX_NAME_BYTES: usize = 255;

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
            return Err(ValidateError::Usage(
                "LOCKPROBE_LOCK_API_KEY: the lock API key must be set (or give --api-key-file)".into(),
            ));
        }
        check_max_inconclusive(self.max_inconclusive)
            .map_err(|why| ValidateError::Usage(format!("--max-inconclusive: {why}")))?;
        self.force_release_keys()?;
        self.check_locations()?;
        self.check_durations()
    }

    fn check_locations(&self) -> Result<(), ValidateError> {
        let usage = |m: String| Err(ValidateError::Usage(format!("--location: {m}")));
        if self.locations.len() != 2 {
            return usage(format!("give exactly two locations (got {})", self.locations.len()));
        }
        if self.locations[0] == self.locations[1] {
            return usage(format!("the two locations must differ (both are {:?})", self.locations[0]));
        }
        for l in &self.locations {
            if l.is_empty() || l.len() > MAX_NAME_BYTES {
                return usage(format!("{l:?} must be 1 to {MAX_NAME_BYTES} bytes"));
            }
            if l.contains(FORBIDDEN_IN_NAMES) || l.chars().any(char::is_control) {
                return usage(format!("{l:?} must not contain '/', '\\', '?', '#' or control characters"));
            }
        }
        Ok(())
    }

    fn check_durations(&self) -> Result<(), ValidateError> {
        let l = &self.leases;
        let mut positive = vec![
            ("--pre-lock-lease", l.pre_lock),
            ("--hard-delete-lease", l.hard_delete),
            ("--write-lease", l.write),
            ("--short-write-lease", l.short_write),
            ("--request-timeout", self.request_timeout),
        ];
        positive.extend(self.deadline.map(|d| ("--deadline", d)));
        for (flag, d) in positive {
            if d.is_zero() {
                return Err(ValidateError::Usage(format!("{flag}: must be longer than zero")));
            }
        }
        // The lease-lapse check waits for the short write lease to lapse while the
        // regular one must outlast the copy: the same length or longer would test nothing.
        if l.short_write >= l.write {
            return Err(ValidateError::Usage(format!(
                "--short-write-lease: {} must be shorter than --write-lease ({})",
                humantime::format_duration(l.short_write),
                humantime::format_duration(l.write)
            )));
        }
        Ok(())
    }

    /// The keys of the force-release check, if two were given and they can be used.
    fn force_release_keys(&self) -> Result<Option<AdminKeys>, ValidateError> {
        let Some((requester, approver)) = &self.admin_keys else { return Ok(None) };
        AdminKeys::checked(requester.clone(), approver.clone(), &self.api_key)
            .map(Some)
            .map_err(|why| ValidateError::Usage(format!("--admin-key-file: {why}")))
    }

    /// Probe settings for a one-shot run: leases long enough for one cycle.
    pub fn settings(&self) -> ProbeSettings {
        ProbeSettings {
            expected_convergence: self.expect_convergence,
            buffer: self.buffer,
            eager: self.eager,
            // Checked by `check`, which every run makes first.
            force_release: self.force_release_keys().ok().flatten(),
            locations: [self.locations[0].clone(), self.locations[1].clone()],
            leases: self.leases.clone(),
            request_timeout: self.request_timeout,
            tls: self.tls.clone(),
            max_inconclusive: self.max_inconclusive,
            clock: self.clock.clone(),
            ..ProbeSettings::short_run(VALIDATE_TARGET, self.endpoints.clone(), self.api_key.clone(), &self.test_prefix)
        }
    }
}

/// Runs the validation and returns its report (`result` tells pass or fail). `cancel`
/// (SIGINT, SIGTERM) stops the cycle early; its locks are released on the way out and the
/// report says the cycle was cancelled. So does the end of `--deadline`, counted from
/// here; the report then says the deadline ran out, with every assertion made so far.
pub async fn run(
    opts: &ValidateOptions,
    observer: Arc<dyn Observer>,
    cancel: CancellationToken,
) -> Result<CycleReport, ValidateError> {
    let started = tokio::time::Instant::now();
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
    let resources = opts.resources(&run_id);
    let stop = cancel.child_token();
    let deadline_passed = CancellationToken::new();
    if let Some(deadline) = opts.deadline {
        let (stop, passed) = (stop.clone(), deadline_passed.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep_until(started + deadline) => {
                    passed.cancel();
                    stop.cancel();
                }
            }
        });
    }
    let mut report = scenario.run_cycle(&resources, stop.clone()).await;
    stop.cancel(); // ends the deadline's timer
    if deadline_passed.is_cancelled() {
        let deadline = opts.deadline.unwrap_or_default();
        report.error = Some(format!(
            "--deadline {} ran out before the cycle completed; its locks were released",
            humantime::format_duration(deadline)
        ));
        report.result = CycleResult::Error;
    }
    Ok(report)
}

impl ValidateOptions {
    /// The test resources a run named `run_id` uses.
    pub fn resources(&self, run_id: &str) -> Vec<String> {
        let count = self.settings().resources_per_cycle();
        (0..count).map(|i| format!("{}v{run_id}-{i}", self.test_prefix)).collect()
    }
}

/// Writes the JUnit XML and JSON reports where asked.
pub fn write_reports(
    report: &CycleReport,
    instances: &[String],
    junit: Option<&Path>,
    json: Option<&Path>,
) -> Result<(), ValidateError> {
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| ValidateError::Write { path: path.to_path_buf(), source })
    };
    if let Some(p) = junit {
        write(p, report.to_junit(instances))?;
    }
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
        write(p, text)?;
    }
    Ok(())
}
