//! The release gate's runs: a candidate service (a `lockprobe` binary built from the
//! library under test, or anything that takes `lockprobe service`'s flags) started once
//! per store-fault profile, probed with the full cycle plus the eager checks
//! ([`super::validate`]), and swept for locks left behind; a profile that decided too
//! little is run again. Faults reach the candidate through the reference service's own
//! fault layer (`--store-fault`, `--clock-skew`); the probe only runs its binary and
//! speaks its HTTP contract. `lockprobe gate` (the wiring) turns its flags into
//! [`GateOptions`], writes the reports and prints the verdict.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::validate::{self, ValidateError, ValidateOptions};
use crate::probe::checks::credentials::TargetTls;
use crate::probe::checks::observer::TracingObserver;
use crate::probe::checks::report::{CycleReport, CycleResult};
use crate::probe::checks::scenario::force_release_resource;
use crate::probe::checks::settings::Leases;
use crate::probe::checks::target::TargetClient;
use crate::probe::checks::vocabulary::Op;

/// The fault profiles, in the order they run by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// No fault: the baseline every other profile is read against.
    Baseline,
    /// Pre-locks commit 3 s late, renewals 1.5 s late (past the end of a lease renewed
    /// just before it).
    SlowCommit,
    /// Lock writes land at once, their answers come 1-2 s later.
    LateAck,
    /// Half the lock writes time out at 250 ms and commit at 600 ms anyway
    /// (`outcome-unknown`); the probe repeats them under their keys. The commit stays
    /// inside the shortest lease the probe asks for (1 s): a write lease that ends before
    /// its escalation commits is honestly answered 410, which would be the profile's
    /// doing, not the candidate's.
    Ambiguous,
    /// Replicas lag by a 2 s declared replication bound (twice the others').
    ReplicaLag,
    /// Instance 1's clock runs 2 s ahead, within a 2.5 s skew margin.
    ClockAhead,
    /// Instance 1's clock runs 2 s behind, within a 2.5 s skew margin.
    ClockBehind,
    /// Instance 1's clock runs 3 s ahead, beyond a 500 ms skew margin: breaks an
    /// assumption, so what breaks is reported, not failed. The skew is more than the eager
    /// renewal's 2 s write lease plus the margin, so instance 1 takes that lease for
    /// lapsed from the moment it is granted (instance 0 decides it, on the true clock) and
    /// accepts the renewal check's writes until the renewal commits, however long the
    /// escalation took: the profile always reports a violation.
    ClockBeyondMargin,
}

impl Profile {
    /// Every profile, in run order.
    pub const ALL: [Profile; 8] = [
        Profile::Baseline,
        Profile::SlowCommit,
        Profile::LateAck,
        Profile::Ambiguous,
        Profile::ReplicaLag,
        Profile::ClockAhead,
        Profile::ClockBehind,
        Profile::ClockBeyondMargin,
    ];

    /// The profile's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Baseline => "baseline",
            Profile::SlowCommit => "slow-commit",
            Profile::LateAck => "late-ack",
            Profile::Ambiguous => "ambiguous",
            Profile::ReplicaLag => "replica-lag",
            Profile::ClockAhead => "clock-ahead",
            Profile::ClockBehind => "clock-behind",
            Profile::ClockBeyondMargin => "clock-beyond-margin",
        }
    }

    /// Whether the profile breaks one of the scheme's assumptions.
    pub fn beyond_assumptions(self) -> bool {
        self == Profile::ClockBeyondMargin
    }

    /// The `lockprobe service` flags that make the fault (replacing the gate's defaults
    /// where they name the same setting).
    pub fn service_args(self) -> Vec<String> {
        let args: &[&str] = match self {
            Profile::Baseline => &[],
            Profile::SlowCommit => {
                &["--store-fault", "replace:delay=3s step=preLock", "--store-fault", "replace:delay=1500ms step=renew"]
            }
            Profile::LateAck => &[
                "--store-fault",
                "replace:late-ack=2s step=preLock",
                "--store-fault",
                "replace:late-ack=1500ms step=renew",
                "--store-fault",
                "replace:late-ack=1s step=swap",
            ],
            Profile::Ambiguous => {
                &["--store-fault", "replace:late-commit=600ms,timeout=250ms@0.5", "--store-fault-seed", "7"]
            }
            Profile::ReplicaLag => &["--replication-bound", "2s"],
            Profile::ClockAhead => &["--clock-skew", "1=+2s", "--skew-margin", "2500ms"],
            Profile::ClockBehind => &["--clock-skew", "1=-2s", "--skew-margin", "2500ms"],
            Profile::ClockBeyondMargin => &["--clock-skew", "1=+3s", "--skew-margin", "500ms"],
        };
        args.iter().map(|s| s.to_string()).collect()
    }

    /// What the profile does, for the report.
    pub fn description(self) -> String {
        let args = self.service_args();
        if args.is_empty() {
            "no fault".to_owned()
        } else {
            args.join(" ")
        }
    }
}

/// What the gate runs, and how.
#[derive(Debug, Clone)]
pub struct GateOptions {
    /// The candidate binary, run as `CANDIDATE service ...` once per profile.
    pub candidate: PathBuf,
    /// Service instances per profile (at least 2: the skew profiles skew instance 1).
    pub instances: u16,
    /// Cache TTL of the candidate's instances.
    pub cache_ttl: Duration,
    /// The probe's wait on top of the declared convergence delay in the main walk.
    pub buffer: Duration,
    /// How long one profile may take, start to end, before it counts as an error.
    pub profile_timeout: Duration,
    /// The largest share of a check's operations that may be inconclusive.
    pub max_inconclusive: f64,
    /// How many more times a profile that decided too little runs.
    pub inconclusive_retries: u8,
    /// TLS to the candidate.
    pub tls: TargetTls,
    /// Extra flags for every `CANDIDATE service` run.
    pub service_args: Vec<String>,
}

/// The lease-lapse check's write lease under the gate: longer than a lock call whose
/// outcome was unknown takes to be answered again (the `ambiguous` profile's 250 ms
/// timeout, then the service's one-second `Retry-After`), so the repeat lands inside
/// the lease it asked for instead of after it (where its honest answer, `410
/// lock-expired`, can only be inconclusive).
pub const GATE_SHORT_WRITE: Duration = Duration::from_millis(2500);

/// The test prefix of the candidate and of every resource the gate's probe locks.
const TEST_PREFIX: &str = "gate-";

/// The variable `lockprobe service` reads its lock API key from: the gate hands its
/// candidate a fresh key there, never in argv.
pub const CANDIDATE_KEY_ENV: &str = "LOCKPROBE_LOCK_API_KEY";

/// How long a candidate has to print where its instances listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What one profile's run gave.
pub struct ProfileOutcome {
    /// The instances' base URLs.
    pub instances: Vec<String>,
    /// The cycle's report, or why there is none.
    pub report: Result<CycleReport, String>,
    /// Live locks left on the run's resources.
    pub left_behind: Vec<String>,
    /// Why each earlier attempt at this profile was run again: it decided too little.
    pub undecided: Vec<String>,
}

impl ProfileOutcome {
    fn failed(why: String) -> Self {
        Self { instances: Vec::new(), report: Err(why), left_behind: Vec::new(), undecided: Vec::new() }
    }

    /// Why this run decided too little to count, when that is its only failure: a
    /// check over its cap of inconclusive operations, and nothing else wrong.
    pub fn only_undecided(&self) -> Option<String> {
        let report = self.report.as_ref().ok()?;
        let failed: Vec<_> = report.assertions.iter().filter(|a| a.failed()).collect();
        let undecided = !failed.is_empty()
            && failed.iter().all(|a| a.op == Op::Decided)
            && report.error.is_none()
            && self.left_behind.is_empty();
        undecided.then(|| {
            let why: Vec<String> =
                failed.iter().map(|a| format!("{}: {}", a.check, a.detail.as_deref().unwrap_or_default())).collect();
            why.join("; ")
        })
    }
}

/// Runs `profile` until it decides: again (up to `--inconclusive-retries` more times)
/// while its only failure is a check that left too many operations inconclusive, each
/// earlier attempt's reason kept for the report.
pub async fn run_until_decided(options: &GateOptions, profile: Profile, shutdown: CancellationToken) -> ProfileOutcome {
    let mut undecided = Vec::new();
    loop {
        let mut outcome = run_profile(options, profile, shutdown.clone()).await;
        match outcome.only_undecided() {
            Some(why) if undecided.len() < usize::from(options.inconclusive_retries) && !shutdown.is_cancelled() => {
                println!(
                    "gate: profile {} decided too little (attempt {}): {why}; running it again",
                    profile.name(),
                    undecided.len() + 1
                );
                undecided.push(why);
            }
            _ => {
                outcome.undecided = undecided;
                return outcome;
            }
        }
    }
}

/// Starts the candidate under `profile`, probes it, looks for locks left behind, stops it.
async fn run_profile(options: &GateOptions, profile: Profile, shutdown: CancellationToken) -> ProfileOutcome {
    let key = hex::encode(rand::random::<[u8; 16]>());
    let admins = match GateAdmins::new() {
        Ok(a) => a,
        Err(e) => return ProfileOutcome::failed(format!("cannot write the admin key files: {e}")),
    };
    let mut child = match start_candidate(options, profile, &key, &admins) {
        Ok(c) => c,
        Err(e) => return ProfileOutcome::failed(e),
    };
    let instances = match listening_urls(&mut child, usize::from(options.instances)).await {
        Ok(urls) => urls,
        Err(e) => {
            let _ = child.kill().await;
            return ProfileOutcome::failed(e);
        }
    };
    let run_id = hex::encode(rand::random::<[u8; 4]>());
    let opts = ValidateOptions {
        endpoints: instances.clone(),
        buffer: options.buffer,
        test_prefix: TEST_PREFIX.to_owned(),
        api_key: key,
        tls: options.tls.clone(),
        eager: true,
        admin_keys: Some(admins.keys.clone()),
        leases: Leases { short_write: GATE_SHORT_WRITE, ..Leases::short_run() },
        run_id: Some(run_id.clone()),
        max_inconclusive: options.max_inconclusive,
        ..ValidateOptions::default()
    };
    let cancel = shutdown.child_token();
    let deadline = {
        let cancel = cancel.clone();
        let timeout = options.profile_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            cancel.cancel();
        })
    };
    let report = match validate::run(&opts, Arc::new(TracingObserver), cancel).await {
        Ok(r) => Ok(r),
        Err(ValidateError::Usage(m)) => Err(format!("the gate's probe settings were refused: {m}")),
        Err(e) => Err(e.to_string()),
    };
    deadline.abort();
    let left_behind = match &report {
        Ok(r) if !shutdown.is_cancelled() => left_behind(&opts, &run_id, r).await,
        _ => Vec::new(),
    };
    let _ = child.kill().await;
    if let Ok(r) = &report {
        if r.result == CycleResult::Error && r.error.as_deref().is_some_and(|e| e.contains("cancelled")) {
            tracing::warn!(profile = profile.name(), "the profile ran out of --profile-timeout");
        }
    }
    ProfileOutcome { instances, report, left_behind, undecided: Vec::new() }
}

/// Live locks on the run's resources once the probe is done: the probe releases every
/// lock it holds on the way out (the lease-lapse check's lock has lapsed), so after the
/// declared convergence delay every instance must route each resource lock-free. A lock
/// still live is one nobody will release before its lease ends: an orphan.
async fn left_behind(opts: &ValidateOptions, run_id: &str, report: &CycleReport) -> Vec<String> {
    let declared = report.declared_convergence_seconds.and_then(|s| Duration::try_from_secs_f64(s).ok());
    tokio::time::sleep(declared.unwrap_or(Duration::from_secs(2)) + Duration::from_millis(500)).await;
    let client = match TargetClient::with_tls(
        &opts.endpoints,
        &opts.api_key,
        &opts.test_prefix,
        Duration::from_secs(10),
        &opts.tls,
    ) {
        Ok(c) => c,
        Err(e) => return vec![format!("cannot look: {e}")],
    };
    let mut found = Vec::new();
    let mut resources = opts.resources(run_id);
    if let Some(main) = resources.first() {
        resources.push(force_release_resource(main));
    }
    for resource in resources {
        for (i, _) in opts.endpoints.iter().enumerate() {
            match client.route(i, &resource).await {
                Ok(r) if r.status == 200 && r.body.get("lock").is_some_and(|l| !l.is_null()) => {
                    let phase = r.body["lock"].get("phase").and_then(|p| p.as_str()).unwrap_or("?").to_owned();
                    found.push(format!("{resource} ({phase}) on instance {i}"));
                }
                // 404: a resource the run never created; anything else is for the cycle's
                // own assertions to have caught.
                _ => {}
            }
        }
    }
    found
}

/// The two admin principals the gate gives its candidate, for the force-release check:
/// their keys in files of a private directory (a key is never in argv), removed when
/// the profile ends.
struct GateAdmins {
    dir: tempfile::TempDir,
    /// The requester's key, then the approver's.
    keys: (String, String),
}

/// The names of the gate's two admin principals.
const GATE_ADMINS: [&str; 2] = ["gate-requester", "gate-approver"];

impl GateAdmins {
    fn new() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("lockprobe-gate-").tempdir()?;
        let key = || hex::encode(rand::random::<[u8; 16]>());
        let keys = (key(), key());
        for (name, key) in GATE_ADMINS.iter().zip([&keys.0, &keys.1]) {
            std::fs::write(dir.path().join(name), key)?;
        }
        Ok(Self { dir, keys })
    }

    /// `--admin-key-file` and `--admin-prefix` of both principals, scoped to the gate's
    /// test prefix.
    fn service_args(&self) -> Vec<String> {
        GATE_ADMINS
            .iter()
            .flat_map(|name| {
                let file = self.dir.path().join(name);
                [
                    "--admin-key-file".to_owned(),
                    format!("{name}={}", file.display()),
                    "--admin-prefix".to_owned(),
                    format!("{name}={TEST_PREFIX}"),
                ]
            })
            .collect()
    }
}

/// `CANDIDATE service` with the gate's settings, the profile's faults and the extra
/// flags, on free ports, its key in the environment (never in argv).
fn start_candidate(options: &GateOptions, profile: Profile, key: &str, admins: &GateAdmins) -> Result<Child, String> {
    let ttl = humantime::format_duration(options.cache_ttl).to_string();
    let mut command = Command::new(&options.candidate);
    command
        .arg("service")
        .args(["--listen", "127.0.0.1:0", "--test-prefix", TEST_PREFIX, "--cache-ttl", &ttl])
        .args(["--instances", &options.instances.to_string()])
        .args(admins.service_args())
        .args(profile.service_args())
        .args(&options.service_args)
        .env(CANDIDATE_KEY_ENV, key)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command.spawn().map_err(|e| format!("cannot start {} service: {e}", options.candidate.display()))
}

/// Reads the candidate's `instance i listening on http://...` lines until all
/// `instances` are up.
pub(super) async fn listening_urls(child: &mut Child, instances: usize) -> Result<Vec<String>, String> {
    let stdout = child.stdout.take().ok_or("the candidate's output is not readable")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut urls = vec![String::new(); instances];
    let mut found = 0;
    let read = async {
        while found < instances {
            let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? else {
                return Err("the candidate exited before all its instances listened".to_owned());
            };
            let Some((index, url)) = parse_listening(&line) else { continue };
            if index < instances && urls[index].is_empty() {
                urls[index] = url;
                found += 1;
            }
        }
        Ok(())
    };
    match tokio::time::timeout(START_TIMEOUT, read).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(format!("the candidate did not listen within {}s", START_TIMEOUT.as_secs())),
    }
    // Keep draining its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(urls)
}

/// `lockprobe service: instance 1 listening on http://127.0.0.1:4321` → `(1, url)`.
fn parse_listening(line: &str) -> Option<(usize, String)> {
    let rest = line.split_once("instance ")?.1;
    let (index, rest) = rest.split_once(" listening on ")?;
    Some((index.trim().parse().ok()?, rest.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_margin_instance_1_takes_the_eager_renewal_lease_for_lapsed_from_its_grant() {
        // Instance 1 enforces a lease decided on the true clock while its own clock is
        // before `expiresAt + margin`, i.e. until `decided + lease + margin - skew` in
        // true time: with the skew past lease + margin, never after the grant. A shorter
        // skew makes the violation depend on how long the escalation took.
        let args = Profile::ClockBeyondMargin.service_args();
        assert_eq!(args, ["--clock-skew", "1=+3s", "--skew-margin", "500ms"]);
        let (skew, margin) = (Duration::from_secs(3), Duration::from_millis(500));
        assert!(skew > crate::probe::checks::scenario::EAGER_RENEWAL_LEASE + margin);
    }

    #[test]
    fn the_service_announces_where_each_instance_listens() {
        assert_eq!(
            parse_listening("lockprobe service: instance 1 listening on http://127.0.0.1:4321"),
            Some((1, "http://127.0.0.1:4321".to_owned()))
        );
        assert_eq!(parse_listening("lockprobe service: declared convergence delay 2s"), None);
    }

    /// A report of one failed assertion of `op` (and a passed one).
    fn outcome(op: Op, left_behind: Vec<String>, error: Option<String>) -> ProfileOutcome {
        use crate::probe::checks::report::{Assertion, CycleResult};
        use crate::probe::checks::vocabulary::{Outcome, Phase};
        let a = |op: Op, passed: bool| Assertion {
            check: "eager/renewal".into(),
            phase: Phase::Write,
            op,
            instance: None,
            expected: Outcome::Decided,
            observed: if passed { Outcome::Decided } else { Outcome::Inconclusive },
            passed,
            at: chrono::Utc::now(),
            duration: Duration::ZERO,
            detail: Some("3 of 3 operations held to the lock were inconclusive".into()),
            inconclusive: None,
        };
        let report = CycleReport {
            target: "validate".into(),
            resource: "gate-v1-0".into(),
            started_at: chrono::Utc::now(),
            finished_at: chrono::Utc::now(),
            result: CycleResult::Failed,
            error,
            assertions: vec![a(Op::Write, true), a(op, false)],
            phase_durations: Vec::new(),
            read_through_seconds: Vec::new(),
            read_through_client_seconds: Vec::new(),
            declared_convergence_seconds: None,
            expected_convergence_seconds: None,
            observed_convergence: Vec::new(),
            notes: Vec::new(),
            store_region_changes: Vec::new(),
            declared_versions: Vec::new(),
            walk: Default::default(),
            decisions: Vec::new(),
        };
        ProfileOutcome { instances: Vec::new(), report: Ok(report), left_behind, undecided: Vec::new() }
    }

    #[test]
    fn only_a_run_whose_sole_failure_is_deciding_too_little_is_run_again() {
        let why = outcome(Op::Decided, Vec::new(), None).only_undecided();
        assert_eq!(why.as_deref(), Some("eager/renewal: 3 of 3 operations held to the lock were inconclusive"));
        // A real failure, an error or a lock left behind is a verdict, never retried away.
        assert_eq!(outcome(Op::Write, Vec::new(), None).only_undecided(), None);
        assert_eq!(outcome(Op::Decided, vec!["gate-v1-0 (write)".into()], None).only_undecided(), None);
        assert_eq!(outcome(Op::Decided, Vec::new(), Some("target unreachable".into())).only_undecided(), None);
        assert_eq!(ProfileOutcome::failed("did not start".into()).only_undecided(), None);
    }
}
