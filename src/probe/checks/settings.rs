//! What one probe cycle needs to know about its target, independent of where it came from
//! (the `serve` config file or the `validate` flags).

use std::sync::Arc;
use std::time::Duration;

use super::credentials::TargetTls;
use crate::clock::{Clock, SystemClock};

/// Test resources one cycle uses: the main cycle plus one per negative check.
pub const RESOURCES_PER_CYCLE: usize = 7;

/// Test resources the eager checks add to a cycle when they are on.
pub const EAGER_RESOURCES: usize = 2;

/// The convergence tolerance: a route read sent later than the declared delay + this
/// after the pre-lock's answer must show the lock (it covers the service's coarse cache
/// clock and the probe's own timers; round trips need no allowance, since a read is
/// served after it is sent). See `docs/probe.md`.
pub const CONVERGENCE_TOLERANCE_CONSTANT: Duration = Duration::from_millis(100);

/// Lease lengths the probe requests for each lock phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leases {
    /// Parent lease of the migration (pre-lock).
    pub pre_lock: Duration,
    /// Lease of the hard-delete phase.
    pub hard_delete: Duration,
    /// Lease of the write phase.
    pub write: Duration,
    /// Deliberately short write lease for the lease-lapse check.
    pub short_write: Duration,
}

impl Default for Leases {
    fn default() -> Self {
        Self {
            pre_lock: Duration::from_secs(48 * 3600),
            hard_delete: Duration::from_secs(6 * 3600),
            write: Duration::from_secs(5 * 60),
            short_write: Duration::from_secs(2),
        }
    }
}

/// Everything a cycle needs about one target.
#[derive(Clone)]
pub struct ProbeSettings {
    /// Target name (metrics label).
    pub name: String,
    /// Base URL of every instance.
    pub instances: Vec<String>,
    /// Lock API key (never logged).
    pub api_key: String,
    /// Extra CA roots and client identity for `https` instances.
    pub tls: TargetTls,
    /// Only resources under this prefix are ever locked.
    pub test_prefix: String,
    /// The two locations a cycle swaps between.
    pub locations: [String; 2],
    /// The operator's expectation of the convergence delay, if any.
    pub expected_convergence: Option<Duration>,
    /// The store's replication bound: the probe never waits less before escalating.
    pub replication_bound: Duration,
    /// Wait on top of the declared convergence delay.
    pub buffer: Duration,
    /// Lease lengths per phase.
    pub leases: Leases,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Poll interval of the route view while measuring convergence.
    pub poll_interval: Duration,
    /// Number of simultaneous pre-locks in the race check.
    pub concurrent_pre_locks: usize,
    /// Owner string sent with every pre-lock: `lockprobe/<target>`, the form the
    /// convergence monitor recognises as the probe's (`monitor::PROBE_OWNER_PREFIX`).
    pub owner: String,
    /// Also run the eager checks (escalate the moment the service allows, then assert
    /// enforcement on every instance at once), on `EAGER_RESOURCES` more resources.
    pub eager: bool,
    /// Two admin principals' keys: when given, the cycle also force-releases a lock of
    /// its own (`negative/force-release`, contract 1.4).
    pub force_release: Option<AdminKeys>,
    /// The largest share of a check's operations that may be inconclusive (their
    /// decision window did not allow holding them to the lock) before the check fails
    /// as `inconclusive`, from 0 to 1.
    pub max_inconclusive: f64,
    /// The wall clock the probe reads beside its monotonic one (the system's; a test
    /// gives one that steps).
    pub clock: Arc<dyn Clock>,
}

/// The default of [`ProbeSettings::max_inconclusive`]: a check may leave a fifth of its
/// operations undecided.
pub const DEFAULT_MAX_INCONCLUSIVE: f64 = 0.2;

/// Checks a cap on the inconclusive share: a number from 0 to 1.
pub fn check_max_inconclusive(share: f64) -> Result<(), String> {
    if share.is_finite() && (0.0..=1.0).contains(&share) {
        Ok(())
    } else {
        Err(format!("must be a share from 0 to 1 (0.2 is a fifth), got {share}"))
    }
}

impl Leases {
    /// Leases long enough for one seconds-scale cycle (`validate`, `demo`).
    pub fn short_run() -> Self {
        Self {
            pre_lock: Duration::from_secs(600),
            hard_delete: Duration::from_secs(300),
            write: Duration::from_secs(120),
            short_write: Duration::from_secs(1),
        }
    }
}

impl ProbeSettings {
    /// Test resources one cycle of these settings uses.
    pub fn resources_per_cycle(&self) -> usize {
        RESOURCES_PER_CYCLE + if self.eager { EAGER_RESOURCES } else { 0 }
    }

    /// The settings of a seconds-scale run against `instances` (what `validate` uses;
    /// `demo` changes what it knows better): short leases, four racing pre-locks, the
    /// route polled every 50 ms, no expectation of the convergence delay and no known
    /// replication bound (the declared delay includes it), a 1 s buffer.
    pub fn short_run(name: &str, instances: Vec<String>, api_key: String, test_prefix: &str) -> Self {
        Self {
            name: name.to_owned(),
            instances,
            api_key,
            tls: TargetTls::default(),
            test_prefix: test_prefix.to_owned(),
            locations: ["westeurope".into(), "northeurope".into()],
            expected_convergence: None,
            replication_bound: Duration::ZERO,
            buffer: Duration::from_secs(1),
            leases: Leases::short_run(),
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(50),
            concurrent_pre_locks: 4,
            owner: format!("lockprobe/{name}"),
            eager: false,
            force_release: None,
            max_inconclusive: DEFAULT_MAX_INCONCLUSIVE,
            clock: Arc::new(SystemClock),
        }
    }
}

/// The keys of the two admin principals the force-release check acts as: one requests,
/// the other approves (a service refuses a principal's approval of its own request).
/// The service names the principals; the probe only presents their keys, which never
/// reach a log line through `{:?}`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKeys {
    /// The requesting principal's key.
    pub requester: String,
    /// The approving principal's key.
    pub approver: String,
}

impl AdminKeys {
    /// Two keys the check can use, or why not: they must differ from each other (one
    /// principal cannot approve its own request) and from the lock API key (which a
    /// service refuses on its admin routes).
    pub fn checked(requester: String, approver: String, api_key: &str) -> Result<Self, String> {
        if requester == approver {
            return Err("the two admin keys are the same: the check needs two principals".into());
        }
        if requester == api_key || approver == api_key {
            return Err("an admin key is the lock API key: admin keys are the principals' own".into());
        }
        Ok(Self { requester, approver })
    }
}

impl std::fmt::Debug for AdminKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminKeys(<redacted>)")
    }
}

impl std::fmt::Debug for ProbeSettings {
    // Hand-written so the API key can never reach a log line through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSettings")
            .field("name", &self.name)
            .field("instances", &self.instances)
            .field("api_key", &"<redacted>")
            .field("tls", &self.tls)
            .field("test_prefix", &self.test_prefix)
            .field("locations", &self.locations)
            .field("expected_convergence", &self.expected_convergence)
            .field("replication_bound", &self.replication_bound)
            .field("buffer", &self.buffer)
            .field("leases", &self.leases)
            .field("force_release", &self.force_release.is_some())
            .field("max_inconclusive", &self.max_inconclusive)
            .finish_non_exhaustive()
    }
}

/// The longest the main walk polls, before its pre-lock, for an instance to answer from
/// a fresh fetch of the routing document (so convergence is measured near its worst
/// case).
pub const PRIMING_LIMIT: Duration = Duration::from_secs(3);

/// The longest wait past a lease's end that a service's skew margin may ask for before
/// the lease-lapse check judges it (the check waits out a short `Retry-After` once).
pub const SKEW_MARGIN_WAIT: Duration = Duration::from_secs(5);

/// How long the lease-lapse check waits for its short write lease to end.
pub fn lapse_wait(short_write: Duration, buffer: Duration) -> Duration {
    short_write + buffer.max(Duration::from_millis(200))
}

/// The wait before escalating a pre-lock that declared `declared`: the declared delay +
/// the buffer, never less than the replication bound. (A service whose `effectiveAt`
/// is later than the declaration makes the probe wait until that instead.)
pub fn escalation_wait(declared: Duration, buffer: Duration, replication_bound: Duration) -> Duration {
    (declared + buffer).max(replication_bound)
}

/// The waits a cycle schedules itself, in the worst case, for a service that declares
/// `declared`: what `check-config` compares a target's `timeout` with. Requests take
/// their own time on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleWaits {
    /// The wait before escalating.
    pub escalation: Duration,
    /// The main walk's waits: priming the caches (at most [`PRIMING_LIMIT`]), then
    /// watching convergence for the wait before escalating, and at least the declared
    /// delay + poll interval + the tolerance constant, and its skew allowance (escalations
    /// an instance with a slow clock still calls early are asked again).
    pub main_walk: Duration,
    /// The longest negative check, the lease lapse: its own wait before escalating, the
    /// short write lease + max(buffer, 200ms), and the skew-margin allowance.
    pub lapse_check: Duration,
    /// The force-release check, when it runs: its wait before escalating, the same wait
    /// again after the approval (the released lock's caches converge as a release's
    /// do), and its skew allowance.
    pub force_release_check: Option<Duration>,
}

impl CycleWaits {
    /// The waits of a cycle with these settings.
    pub fn new(
        declared: Duration,
        buffer: Duration,
        replication_bound: Duration,
        poll_interval: Duration,
        short_write: Duration,
    ) -> Self {
        let escalation = escalation_wait(declared, buffer, replication_bound);
        Self {
            escalation,
            main_walk: PRIMING_LIMIT
                + escalation.max(declared + poll_interval + CONVERGENCE_TOLERANCE_CONSTANT)
                + SKEW_MARGIN_WAIT,
            lapse_check: escalation + lapse_wait(short_write, buffer) + SKEW_MARGIN_WAIT,
            force_release_check: None,
        }
    }

    /// These waits with the force-release check among the negative checks.
    pub fn with_force_release(self) -> Self {
        Self { force_release_check: Some(self.escalation * 2 + SKEW_MARGIN_WAIT), ..self }
    }

    /// The longest of the checks that run side by side after the main walk.
    pub fn checks(&self) -> Duration {
        self.lapse_check.max(self.force_release_check.unwrap_or_default())
    }

    /// The whole cycle: the main walk, then the negative checks side by side.
    pub fn total(&self) -> Duration {
        self.main_walk + self.checks()
    }
}
