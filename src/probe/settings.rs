//! What one probe cycle needs to know about its target, independent of where it came from
//! (the `serve` config file or the `validate` flags).

use std::time::Duration;

/// Test resources one cycle uses: the main cycle plus one per negative check.
pub const RESOURCES_PER_CYCLE: usize = 7;

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
    /// The settings of a seconds-scale run against `instances` (what `validate` uses;
    /// `demo` changes what it knows better): short leases, four racing pre-locks, the
    /// route polled every 50 ms, no expectation of the convergence delay and no known
    /// replication bound (the declared delay includes it), a 1 s buffer.
    pub fn short_run(name: &str, instances: Vec<String>, api_key: String, test_prefix: &str) -> Self {
        Self {
            name: name.to_owned(),
            instances,
            api_key,
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
        }
    }
}

impl std::fmt::Debug for ProbeSettings {
    // Hand-written so the API key can never reach a log line through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSettings")
            .field("name", &self.name)
            .field("instances", &self.instances)
            .field("api_key", &"<redacted>")
            .field("test_prefix", &self.test_prefix)
            .field("locations", &self.locations)
            .field("expected_convergence", &self.expected_convergence)
            .field("replication_bound", &self.replication_bound)
            .field("buffer", &self.buffer)
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}
