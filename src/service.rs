//! The reference resource-owning service: the probe contract (`docs/architecture.md`)
//! over the routing library.
//!
//! - `lock_api`: the orchestrator's lock calls, behind a bearer key and an optional
//!   test-resource prefix.
//! - `admin_api`: the operators' force-release of a stuck lock, requested by one
//!   admin principal and approved by another, each with a key of its own.
//! - `design`: where locks live, `embedded` in the routing document or in a separate
//!   lock `record` read on every operation (the baseline the benchmark compares with).
//! - `data_api`: the route view and the item API, with allow / block / tombstone
//!   from [`crate::routing::enforce()`] and `Server-Timing` on every answer.
//! - `items`: user data, one item store per location.
//! - `input`, `error`: request checks and problem+json errors.
//! - `openapi`: the contract's OpenAPI 3.1 description, served at `GET /openapi.json`.
//! - `metrics`: the service's own metrics on `GET /metrics` (the size of the documents
//!   its lock calls write).
//! - HTTPS, optionally requiring client certificates: [`crate::listener::tls`].
//!
//! Every answer names the contract version and the library version that made it
//! ([`CONTRACT_HEADER`], [`LIBRARY_HEADER`]), so a client sees a mixed fleet.
//!
//! Several instances share one routing store and one set of item stores, but each has
//! its own `RoutingClient` and so its own cache tiers: that is how stale caches and
//! convergence are observed across instances.

// The parts are private: what a caller (the wiring, the harness, the tests) needs is
// re-exported below, so the module layout can change without changing the API. The two
// the wiring reaches into for its own checks are visible to the crate only.
pub(crate) mod admin_api;
mod data_api;
mod design;
mod error;
pub(crate) mod input;
mod items;
mod lock_api;
mod metrics;
mod openapi;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SkewedClock};
use crate::document::FORMAT_1;
use crate::duration::MAX_DURATION;
use crate::exposition;
use crate::listener::{self, Limits};
use crate::routing::cache::TieredCache;
use crate::routing::client::DEFAULT_MAX_DECISION_AGE;
use crate::routing::lifecycle::{DEFAULT_KEYED_RECORDS, DEFAULT_SKEW_MARGIN};
use crate::routing::{ClientOptions, CommitObserver, Deviations, LockPolicy, RoutingClient};
use crate::store::LocationStore;
use crate::versions::{self, NEWEST_FORMAT};
pub use admin_api::AdminPrincipal;
pub use design::LockDesign;
pub use items::ItemStores;
use metrics::ServiceMetrics;

/// Deliberate misbehaviour, for proving that a probe catches it. Off by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Fault {
    /// Allow writes and deletes that a write lock should block.
    IgnoreWriteLock,
    /// Delete physically where a hard-delete lock should keep a tombstone.
    IgnoreHardDeleteLock,
    /// Declare a convergence delay without the cache TTLs (a misdeclared bound).
    UnderDeclareConvergence,
    /// Contract version 1's `effectiveAt`: counted from the decider's clock, so a
    /// pre-lock that the store commits late starts restricting too early.
    LegacyEffectiveAt,
    /// Contract version 1's renewal: it takes effect whenever it lands, even after the
    /// lease lapsed, resurrecting a lease that readers had already seen end.
    LegacyRenewal,
    /// Answer a release 204 without releasing: the lock stays until its lease ends, and
    /// nobody holds its token any more (an orphan, for the release gate to find).
    AckReleaseWithoutReleasing,
    /// Answer a force-release approval 200 `released` without removing the lock: its
    /// old holder keeps acting and the resource stays locked (for the probe's
    /// force-release check to find).
    AckForceReleaseWithoutReleasing,
    /// Contract version 1.0: the `Idempotency-Key` header is ignored, so a repeated
    /// call is a new call (with [`Fault::DeclareNoVersion`], to show how a probe falls
    /// back against such a service; alone, a service that breaks the contract it
    /// declares).
    IgnoreIdempotencyKey,
    /// Answer without `Lockprobe-Contract` and `Lockprobe-Library`, as a service of
    /// contract 1.1 or earlier does.
    DeclareNoVersion,
    /// Caches serve a document whose lock has started instead of reading through to
    /// the write region (reads in the write phase come from a cache).
    ServeLockedFromCache,
    /// A renewal is acknowledged but does not extend the lease.
    UnderRenew,
    /// hardDelete and write leases are capped only at the maximum, so a child lease can
    /// outlive the pre-lock.
    OverExtendChildLease,
    /// A pre-lock longer than `--max-prelock` is granted, and renewals of a pre-lock
    /// are not capped at it.
    IgnoreMaxPrelock,
    /// Contract 1.1's record keeping: at most 16 keyed records, the oldest dropped for
    /// a new one, so a late repeat of a pre-lock whose record was dropped gets a fresh
    /// lock whose token nobody learned.
    LegacyRecordEviction,
}

/// The keyed records contract 1.1 kept before dropping the oldest.
const LEGACY_KEYED_RECORDS: usize = 16;

/// Settings of the reference service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Bearer key of the lock API.
    pub api_key: String,
    /// Who may request and approve force-releases (none: the admin routes refuse
    /// everyone).
    pub admin_principals: Vec<admin_api::AdminPrincipal>,
    /// How long a force-release request waits for its approval.
    pub force_release_window: Duration,
    /// Where a resource's document is created on first use.
    pub home_location: String,
    /// TTL of each cache tier, fastest first.
    pub cache_ttls: Vec<Duration>,
    /// Declared replication bound of the routing store.
    pub replication_bound: Duration,
    /// If set, the lock API accepts only ids with this prefix.
    pub test_prefix: Option<String>,
    /// Longest pre-lock granted, renewals included.
    pub max_pre_lock: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// `Retry-After` never exceeds this, so blocked clients come back soon after a
    /// short write lock ends rather than at the end of its lease.
    pub max_retry_after: Duration,
    /// The clock difference tolerated between instances and the store.
    pub skew_margin: Duration,
    /// The oldest routing decision acted on (see [`ClientOptions::max_decision_age`]).
    pub max_decision_age: Duration,
    /// Deliberate faults (tests of the probe only).
    pub faults: Vec<Fault>,
    /// Instances whose clock is off by a set amount (rehearsing clock skew; a skew
    /// within `skew_margin` must change nothing a client can see).
    pub clock_skews: Vec<ClockSkew>,
    /// The registry served at `GET /metrics`: the store's metrics (e.g. Cosmos request
    /// charges) and, registered on it by [`start`], the service's own (`metrics`).
    /// [`start`] makes one for its own metrics when none is set; an instance built
    /// alone ([`instance`]) serves this as it is, nothing when unset.
    pub metrics: Option<prometheus::Registry>,
    /// Serve HTTPS with this configuration ([`crate::listener::tls::server_config`]) instead of HTTP.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// Where locks live (see [`LockDesign`]).
    pub lock_design: LockDesign,
    /// The newest document format the routing library writes ([`LockPolicy::write_format`]).
    pub write_format: u64,
    /// The listeners' bounds: connections, the time to send a request head (the body
    /// limit is `max_body_bytes`).
    pub limits: Limits,
}

impl ServiceConfig {
    /// Seconds-scale defaults around `api_key`: one 2 s cache tier, 1 s replication
    /// bound, 48 h maximum pre-lock.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            api_key: api_key.into(),
            admin_principals: Vec::new(),
            force_release_window: crate::routing::lifecycle::DEFAULT_FORCE_RELEASE_WINDOW,
            home_location: "westeurope".into(),
            cache_ttls: vec![Duration::from_secs(2)],
            replication_bound: Duration::from_secs(1),
            test_prefix: None,
            max_pre_lock: Duration::from_secs(48 * 3600),
            max_body_bytes: 64 * 1024,
            max_retry_after: Duration::from_secs(5),
            skew_margin: DEFAULT_SKEW_MARGIN,
            max_decision_age: DEFAULT_MAX_DECISION_AGE,
            faults: Vec::new(),
            clock_skews: Vec::new(),
            metrics: None,
            tls: None,
            lock_design: LockDesign::default(),
            write_format: NEWEST_FORMAT,
            limits: Limits::default(),
        }
    }

    /// The convergence delay this service declares with every pre-lock.
    pub fn declared_convergence(&self) -> Duration {
        let max_ttl = self.cache_ttls.iter().copied().max().unwrap_or_default();
        if self.has_fault(Fault::UnderDeclareConvergence) {
            self.replication_bound
        } else {
            max_ttl + self.replication_bound
        }
    }

    /// Whether `fault` is switched on.
    pub fn has_fault(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.api_key.is_empty(), "the lock API key must not be empty");
        self.validate_admins()?;
        input::check_name("home location", &self.home_location).map_err(|e| anyhow::anyhow!(e.detail))?;
        anyhow::ensure!(!self.cache_ttls.is_empty(), "at least one --cache-ttl is needed");
        anyhow::ensure!(!self.max_pre_lock.is_zero(), "--max-prelock must be positive");
        self.limits.validate()?;
        anyhow::ensure!(
            (FORMAT_1..=NEWEST_FORMAT).contains(&self.write_format),
            "--write-format {} is not a format this build writes ({FORMAT_1} to {NEWEST_FORMAT})",
            self.write_format
        );
        // The CLI bounds these already; a config built in code must not get past either,
        // since dates computed from them (now + delay + lease) would overflow and panic.
        let mut durations = vec![
            ("--replication-bound", self.replication_bound),
            ("--max-prelock", self.max_pre_lock),
            ("max_retry_after", self.max_retry_after),
            ("--skew-margin", self.skew_margin),
            ("--max-decision-age", self.max_decision_age),
            ("--force-release-window", self.force_release_window),
        ];
        durations.extend(self.cache_ttls.iter().map(|ttl| ("--cache-ttl", *ttl)));
        durations.extend(
            self.clock_skews.iter().map(|s| ("--clock-skew", s.offset.abs().to_std().unwrap_or(Duration::MAX))),
        );
        for (name, duration) in durations {
            anyhow::ensure!(
                duration <= MAX_DURATION,
                "{name} {} is over the limit of {}",
                humantime::format_duration(duration),
                humantime::format_duration(MAX_DURATION)
            );
        }
        Ok(())
    }
}

impl ServiceConfig {
    /// The admin principals: valid names, each named once, keys long enough, no two
    /// alike and none the lock API's (a principal is told apart by its key alone).
    fn validate_admins(&self) -> anyhow::Result<()> {
        use admin_api::{check_principal_name, MIN_ADMIN_KEY_BYTES};
        let mut names = std::collections::BTreeSet::new();
        for (i, p) in self.admin_principals.iter().enumerate() {
            check_principal_name(&p.name).map_err(|e| anyhow::anyhow!("--admin-key-file: {e}"))?;
            anyhow::ensure!(names.insert(p.name.as_str()), "--admin-key-file: principal {:?} is named twice", p.name);
            anyhow::ensure!(
                p.key.len() >= MIN_ADMIN_KEY_BYTES && p.key.bytes().all(|b| b.is_ascii_graphic()),
                "--admin-key-file {}: the key must be at least {MIN_ADMIN_KEY_BYTES} printable characters without spaces",
                p.name
            );
            anyhow::ensure!(
                p.key != self.api_key,
                "--admin-key-file {}: the admin key is the lock API's key; an admin key must be its own",
                p.name
            );
            if let Some(other) = self.admin_principals[..i].iter().find(|o| o.key == p.key) {
                anyhow::bail!(
                    "--admin-key-file {}: the same key as {}; one key would be two people",
                    p.name,
                    other.name
                );
            }
            for prefix in &p.prefixes {
                anyhow::ensure!(!prefix.is_empty(), "--admin-prefix {}=: the prefix is empty", p.name);
            }
        }
        Ok(())
    }
}

/// One instance's clock set off from the others: `INSTANCE=OFFSET`, e.g. `1=+2s` (ahead)
/// or `0=-1500ms` (behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    /// The instance (0-based).
    pub instance: usize,
    /// How far its clock runs ahead (negative: behind).
    pub offset: chrono::TimeDelta,
}

impl std::str::FromStr for ClockSkew {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected INSTANCE=OFFSET, e.g. 1=+2s or 0=-500ms";
        let (index, offset) = text.split_once('=').ok_or_else(|| format!("{text:?}: {expected}"))?;
        let instance = index.trim().parse().map_err(|_| format!("{index:?} is not an instance number; {expected}"))?;
        let offset = offset.trim();
        let (behind, magnitude) = match offset.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, offset.strip_prefix('+').unwrap_or(offset)),
        };
        let magnitude = humantime::parse_duration(magnitude).map_err(|e| format!("{offset:?}: {e}; {expected}"))?;
        if magnitude > MAX_DURATION {
            return Err(format!("{offset:?} is over the limit of {}", humantime::format_duration(MAX_DURATION)));
        }
        let magnitude = chrono::TimeDelta::from_std(magnitude).map_err(|e| format!("{offset:?}: {e}"))?;
        Ok(Self { instance, offset: if behind { -magnitude } else { magnitude } })
    }
}

impl std::fmt::Display for ClockSkew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = if self.offset < chrono::TimeDelta::zero() { '-' } else { '+' };
        let magnitude = self.offset.abs().to_std().unwrap_or_default();
        write!(f, "{}={sign}{}", self.instance, humantime::format_duration(magnitude))
    }
}

/// What every handler of one instance shares.
#[derive(Debug)]
pub struct Instance {
    /// Instance number (0-based), for logs.
    pub index: usize,
    /// This instance's routing client (its own cache).
    pub routing: RoutingClient,
    /// User data, shared by all instances.
    pub items: Arc<ItemStores>,
    /// Service settings.
    pub config: Arc<ServiceConfig>,
}

/// Builds one instance's state over the shared store and data, its writes observed by
/// nobody (see [`instance_observed`]).
pub fn instance(
    index: usize,
    config: Arc<ServiceConfig>,
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    items: Arc<ItemStores>,
) -> anyhow::Result<Arc<Instance>> {
    instance_observed(index, config, store, clock, items, None)
}

/// [`instance`], handing every version its lock calls write to `observer`: the
/// service's own metrics ([`start`]), or a harness measuring document sizes.
pub fn instance_observed(
    index: usize,
    config: Arc<ServiceConfig>,
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    items: Arc<ItemStores>,
    observer: Option<CommitObserver>,
) -> anyhow::Result<Arc<Instance>> {
    let cache = TieredCache::try_new(&config.cache_ttls)?;
    let deviations = Deviations {
        legacy_effective_at: config.has_fault(Fault::LegacyEffectiveAt),
        legacy_renewal: config.has_fault(Fault::LegacyRenewal),
        cache_serves_started_locks: config.has_fault(Fault::ServeLockedFromCache),
        renewal_not_extended: config.has_fault(Fault::UnderRenew),
        uncapped_child_lease: config.has_fault(Fault::OverExtendChildLease),
        uncapped_pre_lock: config.has_fault(Fault::IgnoreMaxPrelock),
        legacy_record_eviction: config.has_fault(Fault::LegacyRecordEviction),
        ..Deviations::default()
    };
    let policy = LockPolicy {
        convergence_delay: config.declared_convergence(),
        max_pre_lock: config.max_pre_lock,
        skew_margin: config.skew_margin,
        keyed_records: if deviations.legacy_record_eviction { LEGACY_KEYED_RECORDS } else { DEFAULT_KEYED_RECORDS },
        write_format: config.write_format,
        force_release_window: config.force_release_window,
        deviations,
    };
    let options = ClientOptions { max_decision_age: config.max_decision_age, ..ClientOptions::default() };
    let mut routing = RoutingClient::new(store, clock, cache, policy, options);
    if let Some(observer) = observer {
        // The library hands over each version as written: the version a call returns
        // is settled (its pending record dropped), and a call repeated under its
        // idempotency key returns one without writing anything.
        routing = routing.with_commit_observer(observer);
    }
    Ok(Arc::new(Instance { index, routing, items, config }))
}

/// Every path the router serves; `openapi`'s test holds the description to exactly
/// these, method by method, so a route added here without a description fails it.
pub mod paths {
    /// Pre-lock (POST) and release (DELETE).
    pub const LOCK: &str = "/v1/resources/{id}/lock";
    /// Escalate (POST).
    pub const ESCALATE: &str = "/v1/resources/{id}/lock/escalate";
    /// Renew (POST).
    pub const RENEW: &str = "/v1/resources/{id}/lock/renew";
    /// Swap (POST).
    pub const SWAP: &str = "/v1/resources/{id}/lock/swap";
    /// Request a force-release (POST, an admin principal) and list the requests (GET).
    pub const FORCE_RELEASE: &str = "/v1/resources/{id}/lock/force-release";
    /// Approve a force-release request (POST, another admin principal).
    pub const FORCE_RELEASE_APPROVE: &str = "/v1/resources/{id}/lock/force-release/{request}/approve";
    /// The route view (GET).
    pub const ROUTE: &str = "/v1/resources/{id}/route";
    /// Items (GET, PUT, DELETE).
    pub const ITEM: &str = "/v1/resources/{id}/items/{key}";
    /// Liveness (GET).
    pub const HEALTH: &str = "/healthz";
    /// The OpenAPI description (GET).
    pub const OPENAPI: &str = "/openapi.json";
    /// Every path above and `/metrics`.
    pub const ALL: [&str; 11] = [
        LOCK,
        ESCALATE,
        RENEW,
        SWAP,
        FORCE_RELEASE,
        FORCE_RELEASE_APPROVE,
        ROUTE,
        ITEM,
        HEALTH,
        OPENAPI,
        crate::exposition::PATH,
    ];
}

/// The header every answer names the contract version in (`docs/contract.md`, version
/// 1.2), e.g. `1.2`.
pub const CONTRACT_HEADER: &str = "lockprobe-contract";

/// The header every answer names the version of the library that made it in, e.g.
/// `0.1.0`.
pub const LIBRARY_HEADER: &str = "lockprobe-library";

/// Names the versions on `answer`, whatever made it (a route, a refusal, a fallback).
async fn name_versions(mut answer: axum::response::Response) -> axum::response::Response {
    use axum::http::HeaderValue;
    let headers = answer.headers_mut();
    headers.insert(CONTRACT_HEADER, HeaderValue::from_static(versions::CONTRACT_VERSION));
    headers.insert(LIBRARY_HEADER, HeaderValue::from_static(versions::LIBRARY_VERSION));
    answer
}

/// The contract's routes for one instance.
pub fn router(instance: Arc<Instance>) -> Router {
    let limit = instance.config.max_body_bytes;
    let declares = !instance.config.has_fault(Fault::DeclareNoVersion);
    let routes = Router::new()
        .route(paths::LOCK, post(lock_api::pre_lock).delete(lock_api::release))
        .route(paths::ESCALATE, post(lock_api::escalate))
        .route(paths::RENEW, post(lock_api::renew))
        .route(paths::SWAP, post(lock_api::swap))
        .route(paths::FORCE_RELEASE, post(admin_api::request).get(admin_api::list))
        .route(paths::FORCE_RELEASE_APPROVE, post(admin_api::approve))
        .route(paths::ROUTE, get(data_api::route))
        .route(paths::ITEM, get(data_api::read_item).put(data_api::write_item).delete(data_api::delete_item))
        .route(paths::HEALTH, get(|| async { "ok" }))
        .route(paths::OPENAPI, get(openapi::serve))
        .route(exposition::PATH, exposition::route(instance.config.metrics.clone().unwrap_or_default()))
        // After every route: it applies to the routes registered before it. axum still
        // sets `Allow` on its answer.
        .method_not_allowed_fallback(|| async { error::ApiError::method_not_allowed() })
        .fallback(
            |uri: axum::http::Uri| async move { error::ApiError::not_found(format!("no route for {}", uri.path())) },
        )
        .layer(axum::Extension(input::BodyLimit(limit)))
        .layer(DefaultBodyLimit::max(limit));
    // Outermost: every answer, refusals of the layers above included.
    let routes = if declares { routes.layer(axum::middleware::map_response(name_versions)) } else { routes };
    routes.with_state(instance)
}

/// A started service: one listener per instance.
#[derive(Debug)]
pub struct RunningService {
    /// The address each instance listens on, by instance index.
    pub addrs: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningService {
    /// Waits until every instance has shut down (after the shutdown token fired).
    pub async fn wait(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Starts one instance per address in `listen` (port 0 picks a free port), all over
/// `store`, until `shutdown` is cancelled.
pub async fn start(
    config: ServiceConfig,
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    listen: Vec<SocketAddr>,
    shutdown: CancellationToken,
) -> anyhow::Result<RunningService> {
    config.validate()?;
    if let Some(skew) = config.clock_skews.iter().find(|s| s.instance >= listen.len()) {
        anyhow::bail!("--clock-skew {skew}: there are only {} instances", listen.len());
    }
    for skew in &config.clock_skews {
        tracing::warn!(%skew, "CLOCK SKEW ON: this instance's clock is deliberately off");
    }
    for fault in &config.faults {
        tracing::warn!(?fault, "FAULT INJECTION ON: this service deliberately violates the lock contract");
    }
    let mut config = config;
    // The service's own metrics are served even when the caller has no registry for the
    // store's: /metrics then shows them alone.
    let registry = config.metrics.get_or_insert_with(prometheus::Registry::new).clone();
    let metrics = ServiceMetrics::register(&registry)?;
    // One histogram, registered once, shared by every instance.
    let observer: CommitObserver = Arc::new(move |doc| metrics.document_committed(doc));
    let config = Arc::new(config);
    let items = Arc::new(ItemStores::default());
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for (index, addr) in listen.into_iter().enumerate() {
        let clock = match config.clock_skews.iter().rev().find(|s| s.instance == index) {
            Some(skew) => Arc::new(SkewedClock::new(clock.clone(), skew.offset)) as Arc<dyn Clock>,
            None => clock.clone(),
        };
        let state =
            instance_observed(index, config.clone(), store.clone(), clock, items.clone(), Some(observer.clone()))?;
        let listener =
            tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding instance {index} to {addr}"))?;
        let bound = listener.local_addr()?;
        addrs.push(bound);
        tracing::info!(instance = index, addr = %bound, "service instance listening");
        tasks.push(tokio::spawn(evict_periodically(state.clone(), shutdown.clone())));
        let app = router(state);
        let stop = shutdown.clone();
        let tls = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let limits = Limits { max_request_body: config.max_body_bytes, ..config.limits };
        tasks.push(tokio::spawn(async move {
            if let Err(e) = listener::serve(listener, listener::Guards::tls(tls), app, limits, stop).await {
                tracing::error!(instance = index, error = %e, "service instance failed");
            }
        }));
    }
    Ok(RunningService { addrs, tasks })
}

/// Keeps caches from growing without bound in a long-running service.
async fn evict_periodically(instance: Arc<Instance>, shutdown: CancellationToken) {
    let every = instance.config.cache_ttls.iter().copied().max().unwrap_or_default().max(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => instance.routing.evict_expired(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_over_ten_years_are_refused_naming_the_flag() {
        let huge = Duration::from_secs(500_000 * 31_557_600);
        let base = || ServiceConfig::new("k");
        for (config, named) in [
            (ServiceConfig { max_pre_lock: huge, ..base() }, "--max-prelock"),
            (ServiceConfig { cache_ttls: vec![Duration::from_secs(1), huge], ..base() }, "--cache-ttl"),
            (ServiceConfig { replication_bound: huge, ..base() }, "--replication-bound"),
            (
                ServiceConfig { replication_bound: MAX_DURATION + Duration::from_nanos(1), ..base() },
                "--replication-bound",
            ),
            (ServiceConfig { max_retry_after: huge, ..base() }, "max_retry_after"),
        ] {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(named) && e.contains("10years"), "{e}");
        }
    }

    #[test]
    fn durations_at_the_bound_and_a_zero_replication_bound_are_accepted() {
        let at_bound = ServiceConfig {
            cache_ttls: vec![MAX_DURATION],
            replication_bound: MAX_DURATION,
            max_pre_lock: MAX_DURATION,
            max_retry_after: MAX_DURATION,
            ..ServiceConfig::new("k")
        };
        at_bound.validate().unwrap();
        ServiceConfig { replication_bound: Duration::ZERO, ..ServiceConfig::new("k") }.validate().unwrap();
    }

    #[test]
    fn only_the_formats_this_build_writes_are_accepted_as_the_write_format() {
        for format in [0, NEWEST_FORMAT + 1] {
            let e = ServiceConfig { write_format: format, ..ServiceConfig::new("k") }.validate().unwrap_err();
            assert!(e.to_string().contains("--write-format"), "{e}");
        }
        for format in FORMAT_1..=NEWEST_FORMAT {
            ServiceConfig { write_format: format, ..ServiceConfig::new("k") }.validate().unwrap();
        }
    }
}
