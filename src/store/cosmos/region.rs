//! Which region takes writes now, and the client that reads only there.
//!
//! The write region is discovered from the account document ([`AccountReader`]), not
//! configured: at connect, on a timer, and when a store call gives a sign that the
//! account moved (a write refused with 403/3, a write the SDK committed in another
//! region, a 412 that a stale read would explain). When it changes, the write-region
//! client is rebuilt to prefer only the new region, so lock decisions and read-through
//! follow the failover. `--cosmos-write-region` is only an expectation: a mismatch is
//! logged and exported (`lockprobe_cosmos_write_region_mismatch`), never acted on.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::options::Region;
use azure_data_cosmos::CosmosRuntime;

use super::account::{AccountReader, AccountTopology};
use super::metrics::CosmosMetrics;
use super::{build_client, CosmosConfig, CosmosStoreError, Role};

/// Why the write region was looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// At connect.
    Connect,
    /// The periodic refresh.
    Timer,
    /// A write was refused as sent to a region that does not take writes (403/3, or
    /// the SDK's 503/20311 once its own retries were spent).
    WriteForbidden,
    /// The SDK committed a write in a region other than the believed write region.
    WriteElsewhere,
    /// A conditional write failed with 412: the version it was decided on may have come
    /// from a region that is no longer the write region.
    PreconditionFailed,
}

impl Reason {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Timer => "timer",
            Reason::WriteForbidden => "write_forbidden",
            Reason::WriteElsewhere => "write_elsewhere",
            Reason::PreconditionFailed => "precondition_failed",
        }
    }
}

/// A 412 triggers a refresh at most this often: most 412s are plain contention.
pub const PRECONDITION_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The write region in use and the container client that reads only there.
#[derive(Clone)]
pub struct WriteTarget {
    /// The region (normalised name, as the SDK spells it: `westeurope`).
    pub region: Region,
    /// The container, through a client that prefers only `region` and excludes every
    /// other region the account or the configuration names.
    pub container: ContainerClient,
}

/// Tracks the account's write region for one store.
pub struct WriteRegion {
    config: CosmosConfig,
    runtime: CosmosRuntime,
    reader: AccountReader,
    metrics: CosmosMetrics,
    current: RwLock<WriteTarget>,
    /// Every region the account has listed so far (the gauge's label values).
    known: Mutex<Vec<Region>>,
    /// Serialises refreshes; holds when the last one started.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for WriteRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRegion").field("region", &self.region()).finish_non_exhaustive()
    }
}

impl WriteRegion {
    /// Reads the account document once, at connect.
    pub async fn read_account(
        config: &CosmosConfig,
        metrics: &CosmosMetrics,
    ) -> Result<(AccountReader, AccountTopology), CosmosStoreError> {
        let reader = AccountReader::new(config).map_err(CosmosStoreError::Client)?;
        match reader.read().await {
            Ok(mut topology) => {
                metrics.region_refreshed(Reason::Connect.as_str(), "ok");
                if config.legacy_static_write_region {
                    let configured = config.write_region.clone().ok_or_else(|| {
                        CosmosStoreError::Client("the legacy static write region needs a write region".into())
                    })?;
                    topology.write_region = Region::new(configured);
                }
                Ok((reader, topology))
            }
            Err(reason) => {
                metrics.region_refreshed(Reason::Connect.as_str(), "error");
                Err(CosmosStoreError::Client(format!("cannot read the account's write region: {reason}")))
            }
        }
    }

    /// Opens the container through a client that reads only in the write region
    /// `topology` names.
    pub async fn open(
        config: CosmosConfig,
        runtime: CosmosRuntime,
        metrics: CosmosMetrics,
        reader: AccountReader,
        topology: &AccountTopology,
    ) -> Result<Self, CosmosStoreError> {
        let target = open_target(&config, &runtime, topology).await?;
        let known = known_regions(&config, topology);
        metrics.set_write_region(&target.region, &known);
        let tracker = Self {
            config,
            runtime,
            reader,
            metrics,
            current: RwLock::new(target),
            known: Mutex::new(known),
            refreshing: tokio::sync::Mutex::new(Some(Instant::now())),
        };
        tracker.check_expectation(&topology.write_region);
        tracing::info!(write_region = topology.write_region.as_str(), "cosmos write region discovered");
        Ok(tracker)
    }

    /// The write region in use now.
    pub fn region(&self) -> Region {
        self.current.read().expect("write region lock").region.clone()
    }

    /// The write region and its client, as they are now.
    pub fn target(&self) -> WriteTarget {
        self.current.read().expect("write region lock").clone()
    }

    /// Looks the write region up again and switches to it if it moved. Concurrent
    /// callers share one lookup: a caller that waited while another looked it up does
    /// not look again. With `at_most_every`, nothing is done if the last lookup started
    /// less than that long ago.
    pub async fn refresh(&self, reason: Reason, at_most_every: Option<Duration>) {
        if self.config.legacy_static_write_region {
            return;
        }
        let asked = Instant::now();
        let mut last = self.refreshing.lock().await;
        if let Some(started) = *last {
            if started >= asked || at_most_every.is_some_and(|every| started.elapsed() < every) {
                return;
            }
        }
        *last = Some(Instant::now());
        match self.reader.read().await {
            Ok(topology) => {
                let outcome = self.apply(&topology, reason).await;
                self.metrics.region_refreshed(reason.as_str(), outcome);
            }
            Err(why) => {
                self.metrics.region_refreshed(reason.as_str(), "error");
                tracing::warn!(reason = reason.as_str(), %why, "cannot read the cosmos account's write region");
            }
        }
    }

    async fn apply(&self, topology: &AccountTopology, reason: Reason) -> &'static str {
        self.check_expectation(&topology.write_region);
        let old = self.region();
        if topology.write_region == old {
            return "unchanged";
        }
        match open_target(&self.config, &self.runtime, topology).await {
            Ok(target) => {
                let known = {
                    let mut known = self.known.lock().expect("known regions lock");
                    for region in known_regions(&self.config, topology) {
                        if !known.contains(&region) {
                            known.push(region);
                        }
                    }
                    known.clone()
                };
                self.metrics.set_write_region(&target.region, &known);
                self.metrics.failover_seen();
                *self.current.write().expect("write region lock") = target;
                tracing::warn!(
                    from = old.as_str(),
                    to = topology.write_region.as_str(),
                    reason = reason.as_str(),
                    "cosmos write region changed: lock decisions and read-through now read the new write region"
                );
                "changed"
            }
            Err(e) => {
                tracing::warn!(to = topology.write_region.as_str(), error = %e, "cannot open the new cosmos write region");
                "error"
            }
        }
    }

    /// Reports (log and gauge) a configured write region that is not the account's.
    fn check_expectation(&self, actual: &Region) {
        let Some(expected) = &self.config.write_region else {
            self.metrics.set_write_region_mismatch(false);
            return;
        };
        let mismatch = Region::new(expected.clone()) != *actual;
        if self.metrics.set_write_region_mismatch(mismatch) && mismatch {
            tracing::warn!(
                expected = %expected,
                actual = actual.as_str(),
                "--cosmos-write-region is not the account's write region; following the account"
            );
        }
    }

    /// Refreshes every `period` until the tracker is dropped.
    pub fn spawn_timer(this: &Arc<Self>, period: Duration) {
        let weak: Weak<Self> = Arc::downgrade(this);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(tracker) = weak.upgrade() else { break };
                tracker.refresh(Reason::Timer, Some(period / 2)).await;
            }
        });
    }
}

/// The account's regions and the configured ones: what the write-region client must
/// exclude, and the bounded set of the region gauge's labels.
pub(super) fn known_regions(config: &CosmosConfig, topology: &AccountTopology) -> Vec<Region> {
    let mut known = vec![topology.write_region.clone()];
    let configured = config.preferred_regions.iter().chain(config.write_region.iter()).map(|r| Region::new(r.clone()));
    for region in topology.readable_regions.iter().cloned().chain(configured) {
        if !known.contains(&region) {
            known.push(region);
        }
    }
    known
}

async fn open_target(
    config: &CosmosConfig,
    runtime: &CosmosRuntime,
    topology: &AccountTopology,
) -> Result<WriteTarget, CosmosStoreError> {
    let known = known_regions(config, topology);
    let role = Role::WriteRegion { region: topology.write_region.clone(), exclude: known };
    let client = build_client(config, runtime, role).await?;
    let container = client
        .database_client(config.database.clone())
        .container_client(config.container.clone(), None)
        .await
        .map_err(|e| CosmosStoreError::Open {
            database: config.database.clone(),
            container: config.container.clone(),
            reason: e.to_string(),
        })?;
    Ok(WriteTarget { region: topology.write_region.clone(), container })
}
