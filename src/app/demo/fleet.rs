//! A small simulated fleet beside the demo's probe, so the monitor page shows what it is
//! for: migrations of its own resources (`fleet-0001`...) through the routing library on
//! the demo's store, a few a minute, some slow; one orphaned (its orchestrator never comes
//! back) and one escalated before the declared delay plus buffer (by an orchestrator
//! whose own declaration is shorter than the service's). The probe's resources and lock
//! API are not touched: these locks are taken as an orchestrator linking the library
//! would take them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::routing::cache::TieredCache;
use crate::routing::{
    ClientOptions, LockError, LockPolicy, LockToken, Phase, PreLockRequest, RoutingClient, RoutingError,
};
use crate::store::LocationStore;

/// Who the fleet's locks say took them (the monitor keeps the probe's apart by theirs).
const OWNER: &str = "demo-fleet";
const LOCATIONS: [&str; 2] = ["westeurope", "northeurope"];
/// Resources the regular migrations take turns on.
const REGULAR: [&str; 4] = ["fleet-0003", "fleet-0004", "fleet-0005", "fleet-0006"];
/// A write lock held longer than this is a slow migration's.
const SLOW: Duration = Duration::from_secs(1);
/// A new regular migration starts this often: a few a minute.
const EVERY: Duration = Duration::from_secs(9);

/// What the fleet's orchestrators know of the service they lock through.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// The service's cache TTL: the fleet's clients cache for as long.
    pub cache_ttl: Duration,
    /// The convergence delay the service declares.
    pub declared: Duration,
    /// Waited on top of `declared` before escalating (the monitor's buffer).
    pub buffer: Duration,
}

/// Runs the fleet until `stop`; every refusal or store error is logged and the migration
/// given up (a demo's fleet must not take the demo down).
pub async fn run(
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    settings: FleetSettings,
    stop: CancellationToken,
) {
    let client = |declared: Duration, margin: Option<Duration>| {
        let mut policy = LockPolicy::new(declared, Duration::from_secs(3600));
        if let Some(m) = margin {
            policy.skew_margin = m;
        }
        let cache = TieredCache::try_new(&[settings.cache_ttl])?;
        Ok::<_, crate::routing::cache::CacheConfigError>(Arc::new(RoutingClient::new(
            store.clone(),
            clock.clone(),
            cache,
            policy,
            ClientOptions::default(),
        )))
    };
    // The hasty one declares a tenth of the service's delay, and no skew margin: it
    // escalates while caches may still serve the unlocked route, which the monitor
    // exists to see.
    let (honest, hasty) = match (client(settings.declared, None), client(settings.declared / 10, Some(Duration::ZERO)))
    {
        (Ok(honest), Ok(hasty)) => (honest, hasty),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "demo fleet not started");
            return;
        }
    };
    let fleet = Fleet { honest, hasty, settings };
    let work = async {
        tokio::join!(fleet.escalated_early("fleet-0001"), fleet.orphaned("fleet-0002"));
        let mut turn = 0usize;
        let mut running = tokio::task::JoinSet::new();
        loop {
            let fleet = fleet.clone();
            let resource = REGULAR[turn % REGULAR.len()];
            // Every third one holds its write lock longer.
            let write_hold = if turn % 3 == 2 { Duration::from_secs(5) } else { Duration::from_millis(800) };
            running.spawn(async move { fleet.migrate(resource, write_hold).await });
            turn += 1;
            tokio::time::sleep(EVERY).await;
            while running.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        () = work => {}
        () = stop.cancelled() => {}
    }
}

#[derive(Clone)]
struct Fleet {
    honest: Arc<RoutingClient>,
    hasty: Arc<RoutingClient>,
    settings: FleetSettings,
}

impl Fleet {
    fn request(lease: Duration, target: &str) -> PreLockRequest {
        PreLockRequest { owner: OWNER.into(), duration: lease, target_location: Some(target.into()) }
    }

    /// The location `resource` is at now, and the other one, its migration's target.
    async fn route(&self, client: &RoutingClient, resource: &str) -> Result<(String, String), RoutingError> {
        let here = client.resolve_or_create(resource, LOCATIONS[0]).await?.location().to_owned();
        let there = if here == LOCATIONS[0] { LOCATIONS[1] } else { LOCATIONS[0] };
        Ok((here, there.to_owned()))
    }

    /// A migration start to finish: pre-lock, wait out the declared delay and the buffer,
    /// hardDelete, a renewal when the write lock will be held long, write lock held
    /// `write_hold`, swap.
    async fn migrate(&self, resource: &str, write_hold: Duration) {
        if let Err(e) = self.try_migrate(&self.honest, resource, write_hold, true).await {
            tracing::debug!(%resource, error = %e, "demo fleet: migration given up");
        }
    }

    async fn try_migrate(
        &self,
        client: &RoutingClient,
        resource: &str,
        write_hold: Duration,
        wait_out_buffer: bool,
    ) -> Result<(), RoutingError> {
        let (_, there) = self.route(client, resource).await?;
        let grant = client.pre_lock(resource, &Self::request(Duration::from_secs(60), &there)).await?;
        let effective = grant.record.doc.primary.lock.as_ref().map(|l| l.effective_at);
        let buffer = if wait_out_buffer { self.settings.buffer } else { Duration::ZERO };
        if let Some(effective) = effective {
            let wait = (effective - client.clock().now()).to_std().unwrap_or_default() + buffer;
            tokio::time::sleep(wait).await;
        }
        let token = grant.token;
        self.escalate(client, resource, &token, Phase::HardDelete, Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_millis(600)).await;
        if write_hold > SLOW {
            // A slow migration renews its lease before the long write lock.
            client.renew(resource, &token, Duration::from_secs(60)).await?;
        }
        self.escalate(client, resource, &token, Phase::Write, write_hold + Duration::from_secs(10)).await?;
        tokio::time::sleep(write_hold).await;
        client.swap(resource, &token, &there).await?;
        Ok(())
    }

    /// Escalates, trying again shortly while the lock is not yet in force by the clock
    /// that decides (the lifecycle refuses an escalation before `effectiveAt`).
    async fn escalate(
        &self,
        client: &RoutingClient,
        resource: &str,
        token: &LockToken,
        phase: Phase,
        lease: Duration,
    ) -> Result<(), RoutingError> {
        let mut tries = 0;
        loop {
            match client.escalate(resource, token, phase, lease).await {
                Ok(_) => return Ok(()),
                Err(e) if tries < 20 && matches!(e, RoutingError::Lock(LockError::InvalidTransition(_))) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Escalated at the hasty orchestrator's own `effectiveAt`, before the service's
    /// declared delay plus buffer: an early escalation.
    async fn escalated_early(&self, resource: &str) {
        if let Err(e) = self.try_migrate(&self.hasty, resource, Duration::from_millis(800), false).await {
            tracing::debug!(%resource, error = %e, "demo fleet: the early escalation was given up");
        }
    }

    /// A pre-lock whose orchestrator never comes back: its lease lapses with the lock
    /// still in the document, an orphan.
    async fn orphaned(&self, resource: &str) {
        let attempt = async {
            let (_, there) = self.route(&self.honest, resource).await?;
            self.honest.pre_lock(resource, &Self::request(Duration::from_secs(5), &there)).await
        };
        if let Err(e) = attempt.await {
            tracing::debug!(%resource, error = %e, "demo fleet: the orphan was not taken");
        }
    }
}
