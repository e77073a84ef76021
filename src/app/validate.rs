//! `lockprobe validate`: one full probe cycle plus every negative check against the
//! given instances, with JUnit XML and JSON reports. Usage errors are [`UsageError`]s
//! (exit 64).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::usage::UsageError;
use crate::probe::checks::credentials::{
    read_admin_key, read_api_key, CredentialError, CredentialFile, TargetTls, TlsFiles,
};
use crate::probe::checks::observer::PrintObserver;
use crate::probe::checks::report::CycleResult;
use crate::probe::checks::settings::Leases;
use crate::probe::engine::validate::{self, ValidateError, ValidateOptions};

/// Environment variable holding the lock API key for `validate`.
pub const API_KEY_ENV: &str = "LOCKPROBE_LOCK_API_KEY";

/// Flags of `lockprobe validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// Base URL of one instance of the service (repeat for every instance).
    #[arg(long = "endpoint", required = true)]
    pub endpoints: Vec<String>,
    /// Read the lock API key from this file (a mounted secret; its trailing newline is
    /// dropped) instead of LOCKPROBE_LOCK_API_KEY.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// TLS to https endpoints.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Convergence delay the service is expected to declare; a different declaration fails.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration)]
    pub expect_convergence: Option<Duration>,
    /// Wait on top of the declared convergence delay before escalating.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
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
    /// The two locations the cycle swaps between: give the flag twice, the service's home
    /// location (where it creates resources) first.
    #[arg(long = "location", value_name = "NAME", default_values = ["westeurope", "northeurope"])]
    pub locations: Vec<String>,
    /// Lease of the pre-lock (the parent lease of the whole migration).
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "10m")]
    pub pre_lock_lease: Duration,
    /// Lease of the hard-delete phase.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "5m")]
    pub hard_delete_lease: Duration,
    /// Lease of the write phase.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "2m")]
    pub write_lease: Duration,
    /// The deliberately short write lease of the lease-lapse check (shorter than
    /// --write-lease; the check waits for it to lapse).
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub short_write_lease: Duration,
    /// Timeout of one HTTP request.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "10s")]
    pub request_timeout: Duration,
    /// End the whole run by then: the cycle is cancelled, its locks released, the reports
    /// written with what was checked so far, and the exit code is 1.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration)]
    pub deadline: Option<Duration>,
    /// Also escalate at the first instant the service allows and assert enforcement on
    /// every instance at once, and renew a short write lease just before it ends while
    /// every instance writes (the service's own gate, not the orchestrator's patience).
    #[arg(long)]
    pub eager: bool,
    /// An admin principal's key file (contract 1.4): give it twice, the requesting
    /// principal's first, to also force-release a write lock of the run's own and check
    /// that the old token is refused everywhere and writes resume (`negative/force-release`).
    /// The service must scope both principals to the test prefix.
    #[arg(long = "admin-key-file", value_name = "FILE")]
    pub admin_key_files: Vec<PathBuf>,
    /// The largest share (0 to 1) of a check's operations that may be inconclusive
    /// (their decision window did not allow holding them to the lock) before the check
    /// fails as `inconclusive`.
    #[arg(long, value_name = "SHARE", default_value_t = crate::probe::checks::settings::DEFAULT_MAX_INCONCLUSIVE)]
    pub max_inconclusive: f64,
}

/// TLS flags of the commands that probe https endpoints (`validate`, `gate`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM bundle of CA certificates to trust for https endpoints, besides the system's
    /// roots (a private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain to present to endpoints that require mutual TLS.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    /// Reads and checks the files; a problem names the flag and the path.
    pub fn load(&self) -> Result<TargetTls, UsageError> {
        let files = TlsFiles {
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        };
        TargetTls::load(&files).map_err(flag_error)
    }
}

/// A credential file's problem, named by its flag.
fn flag_error(e: CredentialError) -> UsageError {
    let flag = match e.file {
        CredentialFile::ApiKey => "--api-key-file",
        CredentialFile::AdminKey => "--admin-key-file",
        CredentialFile::CaFile => "--ca-file",
        CredentialFile::ClientCert => "--client-cert",
        CredentialFile::ClientKey => "--client-key",
    };
    UsageError::new(format!("{flag} {e}"))
}

/// The lock API key: from `--api-key-file` when given, else from LOCKPROBE_LOCK_API_KEY
/// (empty when unset; the options' check says so).
fn api_key(args: &ValidateArgs) -> Result<String, UsageError> {
    match &args.api_key_file {
        Some(path) => read_api_key(path).map_err(flag_error),
        None => Ok(std::env::var(API_KEY_ENV).unwrap_or_default()),
    }
}

/// The two admin keys of `--admin-key-file`, given twice or not at all.
fn admin_keys(args: &ValidateArgs) -> Result<Option<(String, String)>, UsageError> {
    match args.admin_key_files.as_slice() {
        [] => Ok(None),
        [requester, approver] => {
            Ok(Some((read_admin_key(requester).map_err(flag_error)?, read_admin_key(approver).map_err(flag_error)?)))
        }
        more => Err(UsageError::new(format!(
            "--admin-key-file: give it twice (the requesting principal's key, then the approving one's) or not at all, got {}",
            more.len()
        ))),
    }
}

/// `lockprobe validate`: returns the exit code (0 passed, 1 failed or interrupted by
/// `shutdown`).
pub async fn run(args: ValidateArgs, shutdown: CancellationToken) -> anyhow::Result<u8> {
    let opts = ValidateOptions {
        api_key: api_key(&args)?,
        tls: args.tls.load()?,
        endpoints: args.endpoints.clone(),
        expect_convergence: args.expect_convergence,
        buffer: args.buffer,
        test_prefix: args.test_prefix.clone(),
        state_file: args.state_file.clone(),
        locations: args.locations.clone(),
        leases: Leases {
            pre_lock: args.pre_lock_lease,
            hard_delete: args.hard_delete_lease,
            write: args.write_lease,
            short_write: args.short_write_lease,
        },
        request_timeout: args.request_timeout,
        deadline: args.deadline,
        eager: args.eager,
        admin_keys: admin_keys(&args)?,
        max_inconclusive: args.max_inconclusive,
        run_id: None,
        ..ValidateOptions::default()
    };
    let report = match validate::run(&opts, Arc::new(PrintObserver::default()), shutdown).await {
        Ok(r) => r,
        Err(ValidateError::Usage(m)) => return Err(UsageError::new(m).into()),
        Err(e) => return Err(e.into()),
    };
    validate::write_reports(&report, &args.endpoints, args.junit.as_deref(), args.json.as_deref())?;
    let failed: Vec<_> = report.assertions.iter().filter(|a| a.failed()).collect();
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
