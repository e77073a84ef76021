//! `lockprobe gate`: the release gate's flags, reports and verdict. The runs themselves
//! (the profiles, the candidate, the probe, the sweep for locks left behind) are
//! `crate::probe::engine::gate`. It writes one JUnit report with a testsuite per
//! profile. Exit 1 when a profile within the scheme's
//! assumptions shows any failure (an enforcement violation, a lost write, a resurrected
//! tombstone, a lock left behind, a cycle that could not finish); a profile beyond them
//! is reported, not failed.
//!
//! Faults reach the candidate through the reference service's own fault layer
//! (`--store-fault`, `--clock-skew`): the candidate is a `lockprobe` binary built from
//! the candidate library (or anything that takes `lockprobe service`'s flags).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::app::usage::UsageError;
use crate::probe::engine::gate::{run_until_decided, GateOptions, Profile, ProfileOutcome};
use crate::probe::engine::rollout::{self, RolloutOptions, RolloutProfile};
use crate::probe::outputs::gate_junit::{self, ProfileRun};

/// Flags of `lockprobe gate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GateArgs {
    /// The candidate: a `lockprobe` binary built from the library under test (default:
    /// this one). It is run as `CANDIDATE service ...` once per profile.
    #[arg(long)]
    pub candidate: Option<PathBuf>,
    /// Run only these profiles (repeatable; default: all of them, in order).
    #[arg(long = "profile", value_enum)]
    pub profiles: Vec<Profile>,
    /// Service instances per profile (at least 2: the skew profiles skew instance 1).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=8))]
    pub instances: u16,
    /// Cache TTL of the candidate's instances.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub cache_ttl: Duration,
    /// The probe's wait on top of the declared convergence delay in the main walk.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub buffer: Duration,
    /// How long one profile may take, start to end, before it counts as an error.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "3m")]
    pub profile_timeout: Duration,
    /// The largest share (0 to 1) of a check's operations that may be inconclusive
    /// (their decision window did not allow holding them to the lock) before the check
    /// fails as `inconclusive`.
    #[arg(long, value_name = "SHARE", default_value_t = crate::probe::checks::settings::DEFAULT_MAX_INCONCLUSIVE)]
    pub max_inconclusive: f64,
    /// How many more times a profile runs when its only failure is a check that decided
    /// too little (`inconclusive`): an undecided run is no evidence either way. Every
    /// attempt is in the report.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=10))]
    pub inconclusive_retries: u8,
    /// Write the JUnit XML report here (a testsuite per profile).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write each profile's JSON cycle report into this directory (`<profile>.json`).
    #[arg(long)]
    pub json_dir: Option<PathBuf>,
    /// TLS to the candidate, for a candidate started with `-- --tls-cert .. --tls-key ..`
    /// (and `--tls-client-ca`: then the gate's probe needs --client-cert and --client-key).
    #[command(flatten)]
    pub tls: super::validate::TlsArgs,
    /// Run the rollout profiles instead of the fault profiles: BINARY (the build a fleet
    /// runs now) and the candidate side by side, each instance its own process, over the
    /// store the flags after `--` select (one both versions share: `--store cosmos` and
    /// its `--cosmos-*` flags).
    #[arg(long, value_name = "BINARY", conflicts_with_all = ["profiles", "json_dir"])]
    pub baseline: Option<PathBuf>,
    /// Run only these rollout profiles (repeatable; default: all of them, in order).
    #[arg(long = "rollout", value_enum, requires = "baseline")]
    pub rollouts: Vec<RolloutProfile>,
    /// A flag for the candidate's processes only (repeatable), e.g.
    /// `--candidate-arg=--write-format=1` for a rollout's expand step.
    #[arg(long = "candidate-arg", value_name = "FLAG", allow_hyphen_values = true, requires = "baseline")]
    pub candidate_args: Vec<String>,
    /// A flag for the baseline's processes only (repeatable).
    #[arg(long = "baseline-arg", value_name = "FLAG", allow_hyphen_values = true, requires = "baseline")]
    pub baseline_args: Vec<String>,
    /// The replication bound every rollout instance declares: how far the shared store's
    /// replicas may trail its write region (a geo-replicated account's staleness bound;
    /// the local server has none). Declared too short, caches are judged before they can
    /// have converged.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = crate::duration::parse_bounded_duration,
        default_value = "500ms",
        requires = "baseline"
    )]
    pub replication_bound: Duration,
    /// Extra flags for every `CANDIDATE service` run, after `--` (e.g. `--fault
    /// legacy-effective-at` to see the gate bite).
    #[arg(last = true)]
    pub service_args: Vec<String>,
}

/// `lockprobe gate`: returns the exit code (0 every profile within the assumptions
/// passed, 1 otherwise).
pub async fn run(args: GateArgs, shutdown: CancellationToken) -> anyhow::Result<u8> {
    if let Some(baseline) = &args.baseline {
        return run_rollout(&args, baseline, shutdown).await;
    }
    let options = GateOptions {
        candidate: candidate(&args)?,
        instances: args.instances,
        cache_ttl: args.cache_ttl,
        buffer: args.buffer,
        profile_timeout: args.profile_timeout,
        max_inconclusive: args.max_inconclusive,
        inconclusive_retries: args.inconclusive_retries,
        tls: args.tls.load()?,
        service_args: args.service_args.clone(),
    };
    crate::probe::checks::settings::check_max_inconclusive(args.max_inconclusive)
        .map_err(|why| UsageError::new(format!("--max-inconclusive: {why}")))?;
    let profiles = if args.profiles.is_empty() { Profile::ALL.to_vec() } else { args.profiles.clone() };
    if let Some(dir) = &args.json_dir {
        std::fs::create_dir_all(dir).map_err(|e| UsageError::new(format!("--json-dir {}: {e}", dir.display())))?;
    }
    let started = Instant::now();
    let mut results: Vec<(Profile, ProfileOutcome)> = Vec::new();
    for profile in profiles {
        if shutdown.is_cancelled() {
            break;
        }
        println!("gate: profile {} ({})", profile.name(), profile.description());
        let outcome = run_until_decided(&options, profile, shutdown.clone()).await;
        if let (Some(dir), Ok(report)) = (&args.json_dir, &outcome.report) {
            let path = dir.join(format!("{}.json", profile.name()));
            let text = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
            std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        }
        results.push((profile, outcome));
    }
    let descriptions: Vec<String> = results.iter().map(|(p, _)| p.description()).collect();
    let runs: Vec<ProfileRun<'_>> = results
        .iter()
        .zip(&descriptions)
        .map(|((profile, outcome), description)| ProfileRun {
            profile: profile.name(),
            description,
            beyond_assumptions: profile.beyond_assumptions(),
            instances: &outcome.instances,
            report: outcome.report.as_ref().map_err(Clone::clone),
            left_behind: &outcome.left_behind,
            undecided: &outcome.undecided,
        })
        .collect();
    write_junit(args.junit.as_deref(), || gate_junit::to_junit(&runs))?;
    let failed = summarize(&runs);
    Ok(conclude("profiles", runs.len(), failed, started, &shutdown))
}

/// Runs the rollout profiles, printing a line per profile and each failed answer, note
/// and error under it; returns the exit code (0 all passed, 1 otherwise).
async fn run_rollout(args: &GateArgs, baseline: &Path, shutdown: CancellationToken) -> anyhow::Result<u8> {
    if !baseline.is_file() {
        return Err(UsageError::new(format!("--baseline {}: no such file", baseline.display())).into());
    }
    if !selects_a_shared_store(&args.service_args) {
        return Err(UsageError::new(
            "--baseline runs each instance in its own process, so they need a store they share: \
             pass `-- --store cosmos` and its --cosmos-* flags",
        )
        .into());
    }
    let options = RolloutOptions {
        baseline: baseline.to_owned(),
        candidate: candidate(args)?,
        service_args: args.service_args.clone(),
        baseline_args: args.baseline_args.clone(),
        candidate_args: args.candidate_args.clone(),
        cache_ttl: args.cache_ttl,
        replication_bound: args.replication_bound,
        buffer: args.buffer,
        tls: args.tls.load()?,
    };
    let profiles = if args.rollouts.is_empty() { RolloutProfile::ALL.to_vec() } else { args.rollouts.clone() };
    println!(
        "gate: every instance with cache TTL {} and replication bound {}",
        humantime::format_duration(options.cache_ttl),
        humantime::format_duration(options.replication_bound)
    );
    let started = Instant::now();
    let mut failed = 0;
    let mut reports = Vec::new();
    for profile in &profiles {
        if shutdown.is_cancelled() {
            break;
        }
        println!("gate: rollout profile {}", profile.name());
        let outcome = rollout::run_profile(&options, *profile, shutdown.clone()).await;
        let bad: Vec<_> = outcome.checks.iter().filter(|c| !c.passed).collect();
        let verdict = if outcome.passed() { "passed" } else { "FAILED" };
        println!("  {:<20} {verdict}: {} answers judged, {} failed", profile.name(), outcome.checks.len(), bad.len());
        for check in bad {
            println!("    [{}] {}", profile.name(), check.line());
        }
        if let Some(e) = &outcome.error {
            println!("    [{}] error: {e}", profile.name());
        }
        for note in &outcome.notes {
            println!("    [{}] note: {note}", profile.name());
        }
        failed += usize::from(!outcome.passed());
        reports.push((profile.name(), outcome.junit_cases(*profile)));
    }
    write_junit(args.junit.as_deref(), || gate_junit::rollout_to_junit(&reports))?;
    Ok(conclude("rollout profiles", profiles.len(), failed, started, &shutdown))
}

/// Writes the JUnit report `xml` makes, when `--junit` asked for one.
fn write_junit(path: Option<&Path>, xml: impl FnOnce() -> String) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, xml()).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Prints the gate's last lines for `total` runs of `what`, `failed` of them failed,
/// and returns its exit code: 0 only when every run passed and none was cut short.
fn conclude(what: &str, total: usize, failed: usize, started: Instant, shutdown: &CancellationToken) -> u8 {
    println!("gate: {total} {what} in {:.0}s", started.elapsed().as_secs_f64());
    if shutdown.is_cancelled() {
        println!("gate: INTERRUPTED");
        1
    } else if failed == 0 {
        println!("gate: PASSED");
        0
    } else {
        println!("gate: FAILED ({failed} of {total} {what})");
        1
    }
}

/// Whether `lockprobe service` flags select a store other processes can share (not
/// the default in-memory one, which lives in one process).
fn selects_a_shared_store(service_args: &[String]) -> bool {
    let mut args = service_args.iter();
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--store=") {
            Some(v) => Some(v),
            None if arg == "--store" => args.next().map(String::as_str),
            None => continue,
        };
        return value.is_some_and(|v| v != "memory");
    }
    false
}

/// The candidate binary, checked before anything runs.
fn candidate(args: &GateArgs) -> Result<PathBuf, UsageError> {
    let path = match &args.candidate {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| UsageError::new(format!("--candidate: cannot find this binary: {e}")))?,
    };
    if !path.is_file() {
        return Err(UsageError::new(format!("--candidate {}: no such file", path.display())));
    }
    Ok(path)
}

/// One line per profile, and every failure of a failing one (profile, check, phase,
/// operation and instance are all in the line). Returns how many profiles fail the gate.
fn summarize(runs: &[ProfileRun<'_>]) -> usize {
    let mut failed = 0;
    for run in runs {
        let fails = run.fails_gate();
        failed += usize::from(fails);
        match &run.report {
            Err(why) => println!("  {:<20} ERROR  {why}", run.profile),
            Ok(r) => {
                let bad: Vec<_> = r.assertions.iter().filter(|a| a.failed()).collect();
                let verdict = match (fails, run.beyond_assumptions, bad.is_empty() && r.error.is_none()) {
                    (true, _, _) => "FAILED",
                    (false, true, false) => "REPORTED (beyond the scheme's assumptions)",
                    (false, true, true) => "nothing broke (beyond the assumptions; not a proof)",
                    (false, false, _) => "passed",
                };
                println!(
                    "  {:<20} {verdict}: {} assertions, {} failed, {} enforcement violations",
                    run.profile,
                    r.assertions.len(),
                    bad.len(),
                    r.enforcement_violations()
                );
                for a in bad {
                    println!("    [{}] {}", run.profile, a.line());
                }
                for (i, why) in run.undecided.iter().enumerate() {
                    println!("    [{}] attempt {} decided too little and was run again: {why}", run.profile, i + 1);
                }
                if let Some(e) = &r.error {
                    println!("    [{}] error: {e}", run.profile);
                }
                for lock in run.left_behind {
                    println!("    [{}] FAIL [gate] live lock left behind: {lock}", run.profile);
                }
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_parses_as_service_flags_and_only_one_is_beyond_the_assumptions() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            service: crate::app::service::ServiceArgs,
        }
        for profile in Profile::ALL {
            let argv = ["service"].into_iter().map(String::from).chain(profile.service_args());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{}: {e}", profile.name());
            }
        }
        assert_eq!(Profile::ALL.iter().filter(|p| p.beyond_assumptions()).count(), 1);
    }

    #[test]
    fn only_a_store_other_processes_can_reach_is_shared() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(selects_a_shared_store(&args(&["--store", "cosmos", "--cosmos-endpoint", "http://x"])));
        assert!(selects_a_shared_store(&args(&["--cache-ttl", "1s", "--store=cosmos"])));
        assert!(!selects_a_shared_store(&args(&["--store", "memory"])));
        assert!(!selects_a_shared_store(&args(&["--store"])));
        assert!(!selects_a_shared_store(&args(&[])));
    }

    #[test]
    fn the_candidate_is_given_its_key_where_the_service_reads_it() {
        // The engine names the variable itself (the probe imports no service).
        assert_eq!(crate::probe::engine::gate::CANDIDATE_KEY_ENV, crate::app::service::API_KEY_ENV);
    }
}
