//! Azure Cosmos DB as the [`LocationStore`], through `azure_data_cosmos`.
//!
//! One document per resource, partition key `/id`, stored as
//! [`LocationDocument::to_json`]. Cosmos system fields are stripped on read and never
//! written back. Two SDK clients share one runtime:
//!
//! - the **write-region client** prefers only the account's write region, excludes
//!   every other region, never hedges and reads with `LatestCommitted`: it serves
//!   writes, [`ReadFrom::WriteRegion`] reads (the routing library's read-through),
//!   scans and the change stream, so a lock decision never rests on a replica. The
//!   write region is discovered from the account document and followed across a
//!   failover ([`region`]); `--cosmos-write-region` is only an expectation;
//! - the **replica client** uses the preferred regions for [`ReadFrom::Replica`].
//!
//! Every call has an end-to-end deadline (`request_timeout`, SDK retries included);
//! failures other than 404 / 409 / 412 become [`StoreError::Unavailable`] in one place,
//! [`classify`]. The request charge of every call is added to
//! `lockprobe_cosmos_request_charge_total{op}` on the registry passed in.
//!
//! The change stream is Cosmos DB's change feed, or a query on `_ts` ([`poll`]) where
//! the change feed is not usable (the local test server's is a stub); see
//! [`ChangeStreamMode`] and `docs/cosmos.md`.

pub mod account;
pub mod config;
pub mod metrics;
pub mod poll;
pub mod region;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::FeedScope;
use azure_data_cosmos::models::{ChangeFeedItem, ContainerProperties};
use azure_data_cosmos::options::{
    AvailabilityStrategy, BinaryEncodingOptions, ChangeFeedOptions, ChangeFeedStartFrom, ConnectionPoolOptions,
    ContentResponseOnWrite, EndToEndOperationLatencyPolicy, ExcludedRegions, ItemWriteOptions, MaxItemCountHint,
    OperationOptions, Precondition, QueryOptions, ReadConsistencyStrategy, Region, ServerCertificateValidation,
};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, CosmosClient, CosmosError, CosmosRuntime, Query, RoutingStrategy,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use prometheus::Registry;
use serde_json::{Map, Value};

pub use config::{is_local_emulator, ChangeStreamMode, CosmosAuth, CosmosConfig};
pub use metrics::{CosmosMetrics, Op};

use self::poll::{Candidate, PollCursor};
use self::region::{Reason, WriteRegion, PRECONDITION_REFRESH_INTERVAL};
use super::{
    Change, ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, OpKind, ReadFrom, ScanPage, StoreError,
    Unreadable, Versioned,
};
use crate::document::LocationDocument;

/// Fields Cosmos DB adds to every document. They are not part of the location
/// document: stripped on read, never written.
pub const SYSTEM_FIELDS: [&str; 6] = ["_rid", "_self", "_etag", "_ts", "_attachments", "_lsn"];

const FEED_PREFIX: &str = "feed:";

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CosmosStoreError {
    /// The metrics could not be registered (for example, registered twice).
    #[error("cannot register cosmos metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The SDK client could not be built (a refused setting, or the account could not
    /// be reached to read its regions).
    #[error("cannot create the cosmos client: {0}")]
    Client(String),
    /// The account, database or container could not be reached or created.
    #[error("cannot open cosmos container {database}/{container}: {reason}")]
    Open {
        /// Database name.
        database: String,
        /// Container name.
        container: String,
        /// What failed.
        reason: String,
    },
}

/// The Cosmos DB [`LocationStore`].
pub struct CosmosStore {
    write_region: Arc<WriteRegion>,
    replica: ContainerClient,
    config: CosmosConfig,
    metrics: CosmosMetrics,
}

impl std::fmt::Debug for CosmosStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosStore")
            .field("endpoint", &self.config.endpoint.as_str())
            .field("database", &self.config.database)
            .field("container", &self.config.container)
            .field("write_region", &self.write_region.region().as_str())
            .field("expected_write_region", &self.config.write_region)
            .field("change_stream", &self.config.change_stream)
            .finish_non_exhaustive()
    }
}

impl CosmosStore {
    /// Connects to the container (creating it first if configured to). The store's
    /// metrics are registered on `registry` once it is connected, so a failed attempt
    /// can be retried with the same registry.
    pub async fn connect(config: CosmosConfig, registry: &Registry) -> Result<Self, CosmosStoreError> {
        let metrics = CosmosMetrics::new()?;
        let runtime = build_runtime(&config).await?;
        let (reader, topology) = WriteRegion::read_account(&config, &metrics).await?;
        let replica_role = Role::Replica { write_region: topology.write_region.clone() };
        let replica_client = build_client(&config, &runtime, replica_role).await?;
        let open_error = |reason: String| CosmosStoreError::Open {
            database: config.database.clone(),
            container: config.container.clone(),
            reason,
        };
        if config.create_if_missing {
            let exclude = region::known_regions(&config, &topology);
            let write_role = Role::WriteRegion { region: topology.write_region.clone(), exclude };
            let write_client = build_client(&config, &runtime, write_role).await?;
            let started = Instant::now();
            match create_if_missing(&write_client, &config).await {
                Ok(charge) => metrics.observe(Op::Setup, "ok", charge, started.elapsed()),
                Err(e) => {
                    let charge = e.diagnostics().map(|d| d.total_request_charge().value()).unwrap_or(0.0);
                    metrics.observe(Op::Setup, "unavailable", charge, started.elapsed());
                    return Err(open_error(e.to_string()));
                }
            }
        }
        let write_region =
            Arc::new(WriteRegion::open(config.clone(), runtime, metrics.clone(), reader, &topology).await?);
        let replica = replica_client
            .database_client(config.database.clone())
            .container_client(config.container.clone(), None)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        metrics.register(registry)?;
        WriteRegion::spawn_timer(&write_region, config.region_refresh_interval);
        tracing::info!(
            endpoint = %config.endpoint,
            database = %config.database,
            container = %config.container,
            write_region = write_region.region().as_str(),
            expected_write_region = ?config.write_region,
            change_stream = ?config.change_stream,
            "cosmos store connected"
        );
        Ok(Self { write_region, replica, config, metrics })
    }

    /// The account's write region as the store last discovered it (normalised, as the
    /// SDK spells it: `westeurope`).
    pub fn write_region(&self) -> String {
        self.write_region.region().as_str().to_owned()
    }

    /// The settings this store runs with.
    pub fn config(&self) -> &CosmosConfig {
        &self.config
    }

    /// How often a caught-up change-stream consumer should poll.
    pub fn poll_interval(&self) -> Duration {
        self.config.poll_interval
    }

    /// Runs one SDK call, records its charge, duration and outcome, and maps its error.
    async fn call<T, F>(&self, op: Op, fut: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<(T, f64), CallError>>,
    {
        let started = Instant::now();
        let result = fut.await;
        let mut write_forbidden = false;
        let (outcome, charge, mapped) = match result {
            Ok((value, charge)) => ("ok", charge, Ok(value)),
            Err(CallError::Cosmos(err)) => {
                write_forbidden = refused_for_region(&err);
                let charge = err.diagnostics().map(|d| d.total_request_charge().value()).unwrap_or(0.0);
                let mapped = classify(&err, op.is_write());
                (outcome_label(&mapped), charge, Err(mapped))
            }
            Err(CallError::Store(e, charge)) => (outcome_label(&e), charge, Err(e)),
        };
        self.metrics.observe(op, outcome, charge, started.elapsed());
        // Counted here, logged once by the caller that acts on it (the service's answer,
        // the monitor's loop): a store that logged too would say it twice.
        if let Err(StoreError::Unavailable(reason) | StoreError::OutcomeUnknown(reason)) = &mapped {
            tracing::debug!(op = op.as_str(), %reason, "cosmos call failed");
        }
        // Signs that the account's write region may have moved; the refresh finishes
        // before the caller sees the answer, so its next read goes to the region it finds.
        if write_forbidden {
            self.write_region.refresh(Reason::WriteForbidden, None).await;
        } else if matches!(mapped, Err(StoreError::PreconditionFailed)) {
            self.write_region.refresh(Reason::PreconditionFailed, Some(PRECONDITION_REFRESH_INTERVAL)).await;
        }
        mapped
    }

    /// After a write: if the SDK committed it in a region other than the one the store
    /// believes takes writes (it follows the account's writable location by itself),
    /// the account has moved.
    async fn after_write(&self, believed: &Region, committed_in: Option<Region>) {
        if committed_in.is_some_and(|region| region != *believed) {
            self.write_region.refresh(Reason::WriteElsewhere, None).await;
        }
    }

    async fn read_changes_by_poll(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        let position = PollCursor::decode(&cursor.0).map_err(StoreError::Unavailable)?;
        let overlap = i64::try_from(self.config.poll_overlap.as_secs()).unwrap_or(i64::MAX);
        let fetch = position.fetch_size(limit);
        let query = match position.query_from(overlap) {
            Some(from) => Query::from(format!("SELECT TOP {fetch} * FROM c WHERE c._ts >= @from ORDER BY c._ts"))
                .with_parameter("@from", from)
                .map_err(|e| StoreError::Unavailable(format!("cannot build poll query: {e}")))?,
            None => Query::from(format!("SELECT TOP {fetch} * FROM c ORDER BY c._ts")),
        };
        let rows = self
            .call(Op::Store(OpKind::ReadChanges), async {
                let (rows, charge) = run_query(&self.write_region.target().container, query).await?;
                let candidates = rows
                    .into_iter()
                    .map(candidate)
                    .collect::<Result<Vec<_>, StoreError>>()
                    .map_err(|e| CallError::Store(e, charge))?;
                Ok((candidates, charge))
            })
            .await?;
        // Unreadable versions advance the cursor like the others: skipped, not re-read.
        let (picked, next) = position.advance(rows, limit, overlap);
        let mut batch = ChangeBatch { next: ChangeCursor(next.encode()), ..ChangeBatch::default() };
        for c in picked {
            batch.push(c.item);
        }
        Ok(batch)
    }

    async fn read_changes_by_feed(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        let token = if cursor.0.is_empty() {
            None
        } else {
            let raw = cursor
                .0
                .strip_prefix(FEED_PREFIX)
                .ok_or_else(|| StoreError::Unavailable(format!("not a cosmos change feed cursor: {:?}", cursor.0)))?;
            Some(azure_data_cosmos::feed::ContinuationToken::from_string(raw.to_owned()))
        };
        let page_size = NonZeroU32::new(u32::try_from(limit.max(1)).unwrap_or(u32::MAX)).expect("at least one");
        let mut options = ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(page_size));
        if let Some(token) = token {
            options = options.with_continuation_token(token);
        }
        let container = self.write_region.target().container;
        self.call(Op::Store(OpKind::ReadChanges), async {
            let mut pages = container
                .query_change_feed::<Value>(FeedScope::full_container(), ChangeFeedStartFrom::Beginning, Some(options))
                .await?;
            let page = match pages.next().await {
                Some(page) => page?,
                None => return Err(CallError::Store(StoreError::Unavailable("change feed ended".into()), 0.0)),
            };
            let charge = page.diagnostics().total_request_charge().value();
            let next = pages.to_continuation_token()?;
            // Cosmos may return a few more than the page-size hint (one transaction's
            // writes stay together); they are all delivered, as the continuation is past them.
            let items = page
                .into_items()
                .into_iter()
                .filter_map(|item: ChangeFeedItem<Value>| item.current().cloned())
                .map(|doc| candidate(doc).map(|c| c.item))
                .collect::<Result<Vec<_>, StoreError>>()
                .map_err(|e| CallError::Store(e, charge))?;
            let mut batch =
                ChangeBatch { next: ChangeCursor(format!("{FEED_PREFIX}{}", next.as_str())), ..ChangeBatch::default() };
            for item in items {
                batch.push(item);
            }
            Ok((batch, charge))
        })
        .await
    }
}

/// An SDK error, or a failure found after a successful SDK call (with its charge).
enum CallError {
    Cosmos(CosmosError),
    Store(StoreError, f64),
}

impl From<CosmosError> for CallError {
    fn from(e: CosmosError) -> Self {
        CallError::Cosmos(e)
    }
}

/// The one place that decides what a Cosmos DB failure means to callers.
///
/// 404 (without a sub-status: a missing parent container is not a missing document),
/// 409 and 412 are answers about the document. For a write, a failure that does not
/// prove the request was refused before it was applied (a timeout, a transport error
/// after the request left, a 5xx) is [`StoreError::OutcomeUnknown`]: Cosmos DB may
/// have committed it, now or later. What proves a refusal: any other 4xx but 408 (the
/// service judged the request and did not apply it), and the SDK's transport failures
/// that never put the request on the wire (connect, DNS, HTTP/2 negotiation). Every
/// other failure makes the store [`StoreError::Unavailable`]: for reads, and for the
/// refused writes (400/401/403 mean a misconfigured store, 429 throttling that
/// outlasted the SDK's retries).
pub fn classify(err: &CosmosError, write: bool) -> StoreError {
    let status = err.status();
    if status.is_not_found() {
        return StoreError::NotFound;
    } else if status.is_conflict() {
        return StoreError::Conflict;
    } else if status.is_precondition_failed() {
        return StoreError::PreconditionFailed;
    }
    let code = u16::from(status.status_code());
    let sub_code = status.sub_status().map(u16::from);
    let sub = sub_code.map(|s| format!("/{s}")).unwrap_or_default();
    let message = format!("cosmos {code}{sub}: {err}");
    if write && !write_was_refused(code, sub_code) && !never_sent(err) {
        StoreError::OutcomeUnknown(message)
    } else {
        StoreError::Unavailable(message)
    }
}

/// Sub-statuses of the SDK's own 503 for requests that never reached the wire:
/// connection failed (20010), DNS failed (20012), HTTP/2 incompatible (20015).
const NEVER_SENT: [u16; 3] = [20010, 20012, 20015];

/// Whether the SDK's transport failure wraps one that never reached the wire: its
/// generic 503/20003 carries the real cause (connection refused, say) as its source.
fn never_sent(err: &CosmosError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cause {
        if let Some(inner) = e.downcast_ref::<CosmosError>() {
            let status = inner.status();
            if write_was_refused(u16::from(status.status_code()), status.sub_status().map(u16::from)) {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// Whether a failed write provably took no effect.
fn write_was_refused(code: u16, sub_status: Option<u16>) -> bool {
    let judged_and_refused = (400..500).contains(&code) && code != 408;
    let never_sent = code == 503 && sub_status.is_some_and(|s| NEVER_SENT.contains(&s));
    judged_and_refused || never_sent
}

/// Whether Cosmos DB (403/3, WriteForbidden) or the SDK once its retries were spent
/// (503/20311, ClientWriteForbidden) refused a write as sent to a region that does not
/// take writes.
fn refused_for_region(err: &CosmosError) -> bool {
    let status = err.status();
    status.is_write_forbidden() || status.sub_status().map(u16::from) == Some(CLIENT_WRITE_FORBIDDEN)
}

/// The SDK's sub-status for a write no region accepted after its own recovery.
const CLIENT_WRITE_FORBIDDEN: u16 = 20311;

/// The region that answered the last attempt of an operation.
fn served_by(diagnostics: &azure_data_cosmos::diagnostics::DiagnosticsContext) -> Option<Region> {
    diagnostics.requests().iter().rev().find_map(|request| request.region().cloned())
}

fn outcome_label(e: &StoreError) -> &'static str {
    match e {
        StoreError::NotFound => "not_found",
        StoreError::PreconditionFailed => "precondition_failed",
        StoreError::Conflict => "conflict",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::OutcomeUnknown(_) => "outcome_unknown",
        StoreError::Document(_) => "document_error",
    }
}

/// Removes Cosmos system fields from a stored document.
pub fn strip_system_fields(mut json: Value) -> Value {
    if let Value::Object(map) = &mut json {
        for field in SYSTEM_FIELDS {
            map.remove(field);
        }
    }
    json
}

fn take_string(map: &Map<String, Value>, field: &str) -> Option<String> {
    map.get(field).and_then(Value::as_str).map(str::to_owned)
}

/// A stored version as the change stream met it: a change, or a document this library
/// cannot read.
type Met = Result<Change, Unreadable>;

impl ChangeBatch {
    fn push(&mut self, met: Met) {
        match met {
            Ok(change) => self.changes.push(change),
            Err(unreadable) => self.unreadable.push(unreadable),
        }
    }
}

/// Turns a stored JSON document (system fields included) into a change candidate. A
/// document the library cannot read is still a candidate (it moves the cursor); only an
/// answer that is not a stored Cosmos document at all (no `_etag`, no `_ts`) fails the
/// page, as a failure of the store.
fn candidate(json: Value) -> Result<Candidate<Met>, StoreError> {
    let Value::Object(map) = &json else {
        return Err(StoreError::Unavailable("cosmos returned a non-object document".into()));
    };
    let etag = take_string(map, "_etag").ok_or_else(|| StoreError::Unavailable("document without _etag".into()))?;
    let ts =
        map.get("_ts").and_then(Value::as_i64).ok_or_else(|| StoreError::Unavailable("document without _ts".into()))?;
    let id = take_string(map, "id").unwrap_or_default();
    let committed_at = end_of_second(ts);
    let item = match LocationDocument::from_json(strip_system_fields(json)) {
        Ok(doc) => Ok(Change { doc: Arc::new(Versioned { doc, etag: ETag(etag.clone()), committed_at }) }),
        Err(reason) => Err(Unreadable { id: id.clone(), committed_at, reason }),
    };
    Ok(Candidate { id, etag, ts, item })
}

/// `_ts` is whole seconds, truncated: the write happened within the second it names.
/// The end of that second is the upper bound every reader uses, so a consumer judging
/// "did this happen too early" (the monitor's early-escalation check, the routing
/// library's commit rules) never errs on the unsafe side from truncation.
fn end_of_second(ts: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(ts, 999_999_999).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The commit time a stored document carries in `_ts`.
fn commit_time(json: &Value) -> Result<DateTime<Utc>, StoreError> {
    json.get("_ts")
        .and_then(Value::as_i64)
        .map(end_of_second)
        .ok_or_else(|| StoreError::Unavailable("cosmos returned a document without _ts".into()))
}

fn versioned(json: Value, header_etag: Option<String>) -> Result<Versioned, StoreError> {
    let etag = header_etag
        .or_else(|| json.get("_etag").and_then(Value::as_str).map(str::to_owned))
        .ok_or_else(|| StoreError::Unavailable("cosmos returned a document without an etag".into()))?;
    let committed_at = commit_time(&json)?;
    Ok(Versioned { doc: LocationDocument::from_json(strip_system_fields(json))?, etag: ETag(etag), committed_at })
}

/// Write options that ask for the stored document back, so its `_ts` says when the
/// write was committed.
fn write_options() -> ItemWriteOptions {
    let mut operation = OperationOptions::default();
    operation.content_response_on_write = Some(ContentResponseOnWrite::Enabled);
    ItemWriteOptions::default().with_operation_options(operation)
}

/// The version and commit time of a write's answer (its body is the stored document).
async fn committed(
    response: azure_data_cosmos::models::ItemResponse,
    what: &str,
) -> Result<(Committed, f64), CallError> {
    let charge = response.diagnostics().total_request_charge().value();
    let etag = response.headers().etag().map(|e| ETag(e.to_string()));
    let body: Value = response.into_model()?;
    let missing =
        |field: &str| CallError::Store(StoreError::Unavailable(format!("{what} answered without {field}")), charge);
    let etag = etag.ok_or_else(|| missing("an etag"))?;
    let committed_at = commit_time(&body).map_err(|_| missing("the stored document's _ts"))?;
    Ok((Committed { etag, committed_at }, charge))
}

/// Runs a cross-partition query to the end, summing the charge of every page.
async fn run_query(container: &ContainerClient, query: Query) -> Result<(Vec<Value>, f64), CallError> {
    let mut pages = container
        .query_items::<Value>(query, FeedScope::full_container(), Some(QueryOptions::default()))
        .await?
        .into_pages();
    let mut rows = Vec::new();
    let mut charge = 0.0;
    while let Some(page) = pages.next().await {
        let page = page?;
        charge += page.diagnostics().total_request_charge().value();
        rows.extend(page.into_items());
    }
    Ok((rows, charge))
}

/// Which of the store's clients is built, and around which write region.
#[derive(Debug, Clone)]
enum Role {
    /// Reads only in `region`; every region in `exclude` but `region` is excluded.
    WriteRegion { region: Region, exclude: Vec<Region> },
    /// Reads in the preferred regions (in `write_region` when none are configured).
    Replica { write_region: Region },
}

async fn build_runtime(config: &CosmosConfig) -> Result<CosmosRuntime, CosmosStoreError> {
    let client_error = |e: CosmosError| CosmosStoreError::Client(e.to_string());
    // Connecting must fail well inside the end-to-end deadline so a dead endpoint is
    // reported as unavailable rather than hanging.
    let connect_timeout = (config.request_timeout / 2).clamp(Duration::from_millis(500), Duration::from_secs(5));
    let mut pool = ConnectionPoolOptions::builder().with_max_connect_timeout(connect_timeout);
    if config.is_local_emulator() {
        // The local server speaks HTTP/1.1 only and, with TLS, has a self-signed
        // certificate; the SDK relaxes validation for loopback hosts only.
        pool = pool
            .with_is_http2_allowed(false)
            .with_server_certificate_validation(ServerCertificateValidation::RequiredUnlessEmulator);
    }
    let pool = pool.build().map_err(client_error)?;
    let mut defaults = OperationOptions::default();
    defaults.end_to_end_latency_policy = Some(EndToEndOperationLatencyPolicy::new(config.request_timeout));
    CosmosRuntime::builder()
        .with_connection_pool(pool)
        .with_default_operation_options(defaults)
        .build()
        .await
        .map_err(client_error)
}

/// The regions and default operation options of one of the store's two clients.
fn client_plan(config: &CosmosConfig, role: Role) -> (Vec<Region>, OperationOptions) {
    let mut options = OperationOptions::default();
    let regions = match role {
        Role::WriteRegion { region, exclude } => {
            // Only the write region: a read that cannot reach it fails (unavailable)
            // instead of quietly falling back to a replica that may lag.
            let mut excluded = ExcludedRegions::new();
            let configured = config.preferred_regions.iter().map(|r| Region::new(r.clone()));
            let mut seen = Vec::new();
            for other in exclude.into_iter().chain(configured) {
                if other != region && !seen.contains(&other) {
                    seen.push(other.clone());
                    excluded = excluded.with_region(other);
                }
            }
            options.excluded_regions = Some(excluded);
            options.availability_strategy = Some(AvailabilityStrategy::Disabled);
            options.hedging_enabled = Some(false);
            options.read_consistency_strategy = Some(ReadConsistencyStrategy::LatestCommitted);
            vec![region]
        }
        Role::Replica { write_region } if config.preferred_regions.is_empty() => vec![write_region],
        Role::Replica { .. } => config.preferred_regions.iter().map(|r| Region::new(r.clone())).collect(),
    };
    (regions, options)
}

async fn build_client(
    config: &CosmosConfig,
    runtime: &CosmosRuntime,
    role: Role,
) -> Result<CosmosClient, CosmosStoreError> {
    let endpoint: AccountEndpoint = config
        .endpoint
        .as_str()
        .parse()
        .map_err(|e: CosmosError| CosmosStoreError::Client(format!("endpoint {}: {e}", config.endpoint)))?;
    let account = match &config.auth {
        CosmosAuth::Key(key) => AccountReference::with_authentication_key(endpoint, key.clone()),
        CosmosAuth::Entra(credential) => AccountReference::with_credential(endpoint, credential.clone()),
    };
    let (regions, options) = client_plan(config, role);
    let mut builder = CosmosClient::builder().with_runtime(runtime.clone()).with_default_operation_options(options);
    if config.is_local_emulator() {
        // The local server cannot parse Cosmos binary JSON (every write fails with 500).
        builder = builder.with_binary_encoding_options(BinaryEncodingOptions::new().with_enabled(false));
    }
    builder
        .build(account, RoutingStrategy::PreferredRegions(regions))
        .await
        .map_err(|e| CosmosStoreError::Client(e.to_string()))
}

/// Creates the database and container unless they exist; returns the request charge.
async fn create_if_missing(client: &CosmosClient, config: &CosmosConfig) -> Result<f64, CosmosError> {
    fn charge_of<T>(r: &Result<T, CosmosError>, f: impl Fn(&T) -> f64) -> f64 {
        match r {
            Ok(v) => f(v),
            Err(e) => e.diagnostics().map(|d| d.total_request_charge().value()).unwrap_or(0.0),
        }
    }
    fn tolerate_conflict<T>(r: Result<T, CosmosError>) -> Result<(), CosmosError> {
        match r {
            Err(e) if !e.status().is_conflict() => Err(e),
            _ => Ok(()),
        }
    }
    let database = client.create_database(&config.database, None).await;
    let mut charge = charge_of(&database, |r| r.diagnostics().total_request_charge().value());
    tolerate_conflict(database)?;
    let properties = ContainerProperties::new(config.container.clone(), "/id".into());
    let container = client.database_client(config.database.clone()).create_container(properties, None).await;
    charge += charge_of(&container, |r| r.diagnostics().total_request_charge().value());
    tolerate_conflict(container)?;
    Ok(charge)
}

#[async_trait]
impl LocationStore for CosmosStore {
    fn region(&self) -> Option<String> {
        Some(self.write_region())
    }

    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        let (op, container) = match from {
            ReadFrom::WriteRegion => (Op::Store(OpKind::ReadWriteRegion), self.write_region.target().container),
            ReadFrom::Replica => (Op::Store(OpKind::ReadReplica), self.replica.clone()),
        };
        self.call(op, async {
            let response = container.read_item(id.to_owned(), id, None).await?;
            let charge = response.diagnostics().total_request_charge().value();
            let etag = response.headers().etag().map(|e| e.to_string());
            let json: Value = response.into_model()?;
            versioned(json, etag).map(|v| (v, charge)).map_err(|e| CallError::Store(e, charge))
        })
        .await
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        let body = strip_system_fields(doc.to_json());
        let target = self.write_region.target();
        let mut committed_in = None;
        let result = self
            .call(Op::Store(OpKind::Create), async {
                let response =
                    target.container.create_item(doc.id.clone(), &doc.id, &body, Some(write_options())).await?;
                committed_in = served_by(&response.diagnostics());
                committed(response, "create").await
            })
            .await;
        self.after_write(&target.region, committed_in).await;
        result
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        let body = strip_system_fields(doc.to_json());
        let options = write_options().with_precondition(Precondition::if_match(if_match.0.clone()));
        let target = self.write_region.target();
        let mut committed_in = None;
        let result = self
            .call(Op::Store(OpKind::Replace), async {
                let response = target.container.replace_item(doc.id.clone(), &doc.id, &body, Some(options)).await?;
                committed_in = served_by(&response.diagnostics());
                committed(response, "replace").await
            })
            .await;
        self.after_write(&target.region, committed_in).await;
        result
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        match self.config.change_stream {
            ChangeStreamMode::Poll => self.read_changes_by_poll(cursor, limit).await,
            ChangeStreamMode::ChangeFeed => self.read_changes_by_feed(cursor, limit).await,
        }
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        if limit == 0 {
            return Ok(ScanPage::default());
        }
        let query = match after {
            Some(after) => Query::from(format!("SELECT TOP {limit} * FROM c WHERE c.id > @after ORDER BY c.id"))
                .with_parameter("@after", after)
                .map_err(|e| StoreError::Unavailable(format!("cannot build scan query: {e}")))?,
            None => Query::from(format!("SELECT TOP {limit} * FROM c ORDER BY c.id")),
        };
        let container = self.write_region.target().container;
        self.call(Op::Store(OpKind::Scan), async {
            let (rows, charge) = run_query(&container, query).await?;
            let mut page = ScanPage::default();
            for row in rows {
                // As in the change stream: a document the library cannot read is set
                // apart, and only an answer that is no stored document fails the page.
                let id = row.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let committed_at = commit_time(&row).map_err(|e| CallError::Store(e, charge))?;
                match versioned(row, None) {
                    Ok(version) => page.documents.push(version),
                    Err(StoreError::Document(reason)) => page.unreadable.push(Unreadable { id, committed_at, reason }),
                    Err(other) => return Err(CallError::Store(other, charge)),
                }
            }
            Ok((page, charge))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn system_fields_are_stripped_and_unknown_fields_kept() {
        let stored = json!({
            "id": "r1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null},
            "addedLater": {"x": 1},
            "_rid": "abc", "_self": "dbs/x", "_etag": "\"e\"", "_ts": 1, "_attachments": "attachments/"
        });
        let v = versioned(stored, Some("\"e\"".into())).unwrap();
        let written = v.doc.to_json();
        for field in SYSTEM_FIELDS {
            assert!(written.get(field).is_none(), "{field} must not be written back");
        }
        assert_eq!(written["addedLater"], json!({"x": 1}));
        assert_eq!(v.etag, ETag("\"e\"".into()));
    }

    fn config(preferred: &[&str], write: &str) -> CosmosConfig {
        CosmosConfig {
            endpoint: "https://acct.documents.azure.com/".parse().unwrap(),
            auth: CosmosAuth::Key(azure_core::credentials::Secret::new("a2V5")),
            database: "d".into(),
            container: "c".into(),
            preferred_regions: preferred.iter().map(|r| r.to_string()).collect(),
            write_region: Some(write.into()),
            create_if_missing: false,
            change_stream: ChangeStreamMode::ChangeFeed,
            poll_interval: Duration::from_secs(1),
            poll_overlap: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            region_refresh_interval: Duration::from_secs(30),
            legacy_static_write_region: false,
        }
    }

    #[test]
    fn the_write_region_client_can_reach_only_the_write_region() {
        let config = config(&["North Europe", "West Europe", "East US"], "West Europe");
        let role =
            Role::WriteRegion { region: Region::WEST_EUROPE, exclude: vec![Region::WEST_EUROPE, Region::UK_SOUTH] };
        let (regions, options) = client_plan(&config, role);
        assert_eq!(regions, [Region::WEST_EUROPE]);
        let excluded: Vec<&Region> = options.excluded_regions.as_ref().unwrap().iter().collect();
        assert_eq!(excluded, [&Region::UK_SOUTH, &Region::NORTH_EUROPE, &Region::EAST_US]);
        assert_eq!(options.hedging_enabled, Some(false));
        assert!(matches!(options.availability_strategy, Some(AvailabilityStrategy::Disabled)));
        assert_eq!(options.read_consistency_strategy, Some(ReadConsistencyStrategy::LatestCommitted));
    }

    #[test]
    fn the_replica_client_follows_the_preferred_regions() {
        let replica = || Role::Replica { write_region: Region::WEST_EUROPE };
        let (regions, options) = client_plan(&config(&["North Europe", "West Europe"], "West Europe"), replica());
        assert_eq!(regions, [Region::NORTH_EUROPE, Region::WEST_EUROPE]);
        assert!(options.excluded_regions.is_none() && options.read_consistency_strategy.is_none());
        let (regions, _) = client_plan(&config(&[], "West Europe"), replica());
        assert_eq!(regions, [Region::WEST_EUROPE], "without preferred regions, replica reads use the write region");
    }

    #[test]
    fn a_write_is_known_refused_only_when_cosmos_judged_it_or_it_never_left() {
        for (code, sub) in
            [(400, None), (403, None), (429, Some(3200)), (413, None), (503, Some(20010)), (503, Some(20012))]
        {
            assert!(write_was_refused(code, sub), "{code}/{sub:?}");
        }
        // A timeout, a transport failure after sending, a server error: maybe applied.
        for (code, sub) in [
            (408, None),
            (408, Some(20008)),
            (500, None),
            (503, None),
            (503, Some(20003)),
            (503, Some(20011)),
            (503, Some(20014)),
        ] {
            assert!(!write_was_refused(code, sub), "{code}/{sub:?}");
        }
    }

    #[test]
    fn a_document_without_ts_has_no_commit_time() {
        let stored = json!({"id": "r1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null}, "_etag": "e"});
        assert!(matches!(versioned(stored, None), Err(StoreError::Unavailable(_))));
    }

    #[test]
    fn candidates_carry_commit_time_and_body_etag() {
        let stored = json!({
            "id": "r1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null}, "_etag": "e7", "_ts": 1_767_225_600
        });
        let c = candidate(stored).unwrap();
        assert_eq!((c.id.as_str(), c.etag.as_str(), c.ts), ("r1", "e7", 1_767_225_600));
        let change = c.item.unwrap();
        assert_eq!(
            change.doc.committed_at.to_rfc3339(),
            "2026-01-01T00:00:00.999999999+00:00",
            "the end of the second _ts names"
        );
        assert_eq!(change.doc.etag, ETag("e7".into()));
    }

    #[test]
    fn a_document_the_library_refuses_is_still_a_candidate_and_set_apart() {
        let newer = json!({"id": "r2", "schemaVersion": 99, "_etag": "e8", "_ts": 1_767_225_600});
        let c = candidate(newer).unwrap();
        assert_eq!((c.id.as_str(), c.etag.as_str()), ("r2", "e8"), "it moves the poll cursor like any other");
        let unreadable = c.item.unwrap_err();
        assert_eq!((unreadable.id.as_str(), unreadable.reason.reason()), ("r2", "unsupported-format"));
        assert_eq!(unreadable.committed_at.to_rfc3339(), "2026-01-01T00:00:00.999999999+00:00");
        let malformed = candidate(json!({"id": "r3", "schemaVersion": 1, "_etag": "e9", "_ts": 1})).unwrap();
        assert_eq!(malformed.item.unwrap_err().reason.reason(), "malformed");
        // Not a stored document at all: the store failed, the page fails.
        assert!(matches!(candidate(json!({"id": "r4", "schemaVersion": 1})), Err(StoreError::Unavailable(_))));
    }
}
