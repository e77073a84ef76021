//! `RoutingClient`: what a service links to resolve routes and mutate locks.
//!
//! Resolve goes through the tiered cache; a cached document carrying a started lock
//! is re-read from the write region (never a replica) on every resolve. Every document
//! read is settled ([`lifecycle::settle`]) with its commit time before anything acts on
//! it. Lock operations read from the write region, decide with the pure lifecycle and
//! write it back with If-Match on the ETag read; on 412 they re-read and re-decide, up
//! to a retry budget. A successful operation makes exactly one write; an idempotency
//! key (the caller's, or one the client makes up) lets a repeat or an ambiguous
//! outcome find out what the first write did.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use chrono::{DateTime, Utc};

use futures::future::{ready, Either, FutureExt};

use super::cache::{Lookup, TieredCache};
use super::force_release::{self, AdminCall};
use super::freshness;
use super::lifecycle::{self, Decided, LockCall, LockError, LockPolicy, PreLockRequest};
use crate::clock::{span, to_chrono, unix_nanos, Clock};
use crate::document::{self, DocumentError, LocationDocument, LockInfo, LockToken, Phase};
use crate::store::{Committed, ETag, LocationStore, ReadFrom, StoreError, Versioned};

/// Which way a resolve went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Served from a cache tier, no store read.
    Cache,
    /// Re-read from the write region: the cached document carries a started lock, or a
    /// replica had no view of it that can be trusted (a lock that may lag, no document).
    ReadThrough,
    /// Cache miss: read from the store.
    Store,
}

impl Source {
    /// The name used in route views and `Server-Timing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::ReadThrough => "read-through",
            Source::Store => "store",
        }
    }
}

/// The routing path's answer for one resource.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The document and its ETag.
    pub record: Arc<Versioned>,
    /// Which way the resolve went.
    pub source: Source,
    /// Time spent in store reads (zero for a cache hit).
    pub store_time: Duration,
}

impl Resolved {
    /// The active location.
    pub fn location(&self) -> &str {
        &self.record.doc.primary.location
    }

    /// The primary lock as resolved (possibly expired; `enforce` decides).
    pub fn lock(&self) -> Option<&LockInfo> {
        self.record.doc.primary.lock.as_ref()
    }

    /// This answer, lent.
    pub fn as_lent(&self) -> Lent<'_> {
        Lent { record: &self.record, source: self.source, store_time: self.store_time }
    }
}

/// The routing path's answer for one resource, lent by [`RoutingClient::resolve_with`]:
/// a cache hit lends the cached document itself, so it takes no reference on it.
#[derive(Debug, Clone, Copy)]
pub struct Lent<'r> {
    /// The document and its ETag.
    pub record: &'r Arc<Versioned>,
    /// Which way the resolve went.
    pub source: Source,
    /// Time spent in store reads (zero for a cache hit).
    pub store_time: Duration,
}

impl Lent<'_> {
    /// The active location.
    pub fn location(&self) -> &str {
        &self.record.doc.primary.location
    }

    /// The primary lock as resolved (possibly expired; `enforce` decides).
    pub fn lock(&self) -> Option<&LockInfo> {
        self.record.doc.primary.lock.as_ref()
    }

    /// The answer taken out of the lending scope (the document's `Arc` cloned).
    pub fn to_resolved(&self) -> Resolved {
        Resolved { record: self.record.clone(), source: self.source, store_time: self.store_time }
    }
}

/// Why the cache did not serve a resolve.
#[derive(Debug, Clone, Copy)]
enum Unserved {
    /// The cached document carries a started lock.
    ReadThrough,
    /// Nothing fresh.
    Miss,
}

/// A granted pre-lock: the document written and the token, for the caller only.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The document as written.
    pub record: Arc<Versioned>,
    /// The new lock token.
    pub token: LockToken,
}

/// Why a routing call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// The lifecycle refused the operation.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// No document for that resource.
    #[error("no location document for this resource")]
    NotFound,
    /// Concurrent writers kept changing the document; nothing was written.
    #[error("the document kept changing; gave up after {attempts} attempts")]
    RetryExhausted {
        /// Attempts made.
        attempts: u32,
    },
    /// The store failed; nothing was written.
    #[error("routing store unavailable: {0}")]
    Unavailable(String),
    /// A write may or may not have been applied (and may still land): the caller must
    /// repeat the call with the same idempotency key to learn its outcome.
    #[error("the outcome of the write is unknown: {0}")]
    OutcomeUnknown(String),
    /// The stored document is unusable by this version.
    #[error(transparent)]
    Document(#[from] DocumentError),
}

impl From<StoreError> for RoutingError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => RoutingError::NotFound,
            StoreError::Unavailable(m) => RoutingError::Unavailable(m),
            StoreError::OutcomeUnknown(m) => RoutingError::OutcomeUnknown(m),
            StoreError::Document(d) => RoutingError::Document(d),
            // Callers handle these where they can happen; anywhere else they mean the
            // store broke its contract.
            StoreError::PreconditionFailed | StoreError::Conflict => RoutingError::Unavailable(e.to_string()),
        }
    }
}

/// Tuning of the client's protocol (not of the locks themselves).
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Attempts per lock operation when writes race (412) or end ambiguously.
    pub retry_budget: u32,
    /// The oldest routing decision this client acts on: a store read that took longer
    /// (a slow or late answer) is refused rather than enforced, since the lock may have
    /// changed meanwhile. It bounds how long after a restricting write an operation
    /// decided before it can still be applied; a swap copies data only once that long
    /// has passed since the write lock began.
    pub max_decision_age: Duration,
}

/// The decision age when none is configured.
pub const DEFAULT_MAX_DECISION_AGE: Duration = Duration::from_secs(1);

impl Default for ClientOptions {
    fn default() -> Self {
        Self { retry_budget: 8, max_decision_age: DEFAULT_MAX_DECISION_AGE }
    }
}

/// What [`RoutingClient::prepare_swap`] found.
#[derive(Debug, Clone)]
pub enum SwapPlan {
    /// The swap can be made: copy the data, then call [`RoutingClient::swap_with_key`].
    Copy(Arc<Versioned>),
    /// This key's swap took effect already: answer as then, copy nothing.
    AlreadySwapped(Arc<Versioned>),
}

/// Called with each document version a lock call of the client wrote, as written: what
/// the store holds, pending record included, which the version a call returns (settled)
/// no longer carries. Once per version the store committed, whether or not the call then
/// took effect: when the store confirmed it, or, for a write whose outcome the store left
/// unknown, when the call's own re-read finds it landed (its key's record is there); a
/// write refused by the store is not seen, nor one whose outcome stays unknown, nor a
/// call answered from the record of an earlier call. Runs on the caller's task right
/// after the store's answer: keep it cheap.
pub type CommitObserver = Arc<dyn Fn(&LocationDocument) + Send + Sync>;

/// The observer, if any, shown in `Debug` only by its presence.
#[derive(Default)]
struct Observer(Option<CommitObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(CommitObserver)" } else { "None" })
    }
}

/// The routing library's entry point for one service instance (one cache).
#[derive(Debug)]
pub struct RoutingClient {
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    cache: TieredCache,
    policy: LockPolicy,
    options: ClientOptions,
    observer: Observer,
}

impl RoutingClient {
    /// A client over `store` with its own `cache`, granting locks under `policy`.
    pub fn new(
        store: Arc<dyn LocationStore>,
        clock: Arc<dyn Clock>,
        cache: TieredCache,
        policy: LockPolicy,
        options: ClientOptions,
    ) -> Self {
        Self { store, clock, cache, policy, options, observer: Observer::default() }
    }

    /// This client, calling `observer` with every version its lock calls write (see
    /// [`CommitObserver`]): how a service measures the documents it commits.
    pub fn with_commit_observer(mut self, observer: CommitObserver) -> Self {
        self.observer = Observer(Some(observer));
        self
    }

    fn committed(&self, written: &LocationDocument) {
        if let Some(observe) = &self.observer.0 {
            observe(written);
        }
    }

    /// The lock policy (declared convergence delay, maximum pre-lock, skew margin).
    pub fn policy(&self) -> &LockPolicy {
        &self.policy
    }

    /// The store's region now (see [`LocationStore::region`]).
    pub fn store_region(&self) -> Option<String> {
        self.store.region()
    }

    /// The clock this client reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Drops expired cache entries; call periodically.
    pub fn evict_expired(&self) {
        self.cache.evict_expired(self.clock.now_unix_nanos());
    }

    /// Resolves the routing document of `id`. A servable cache hit completes without
    /// an await point or allocation; misses and read-throughs go to the store. The
    /// answer holds a reference on the document; [`Self::resolve_with`] lends it.
    ///
    /// What a service does on every request: resolve, then act at the location the
    /// document names (and [`crate::routing::enforce()`] its lock).
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use lockprobe::clock::SystemClock;
    /// use lockprobe::routing::{cache::TieredCache, ClientOptions, LockPolicy, RoutingClient, Source};
    /// use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let clock = Arc::new(SystemClock);
    /// let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    /// let ttl = Duration::from_secs(5);
    /// let client = RoutingClient::new(
    ///     store,
    ///     clock,
    ///     TieredCache::try_new(&[ttl])?,
    ///     LockPolicy::declared(ttl, Duration::from_secs(1), Duration::from_secs(48 * 3600)),
    ///     ClientOptions::default(),
    /// );
    /// client.resolve_or_create("user-42", "westeurope").await?;
    ///
    /// let route = client.resolve("user-42").await?;
    /// assert_eq!(route.location(), "westeurope");
    /// assert_eq!(route.source, Source::Cache, "the second resolve is served by the cache");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn resolve<'a>(&'a self, id: &'a str) -> impl Future<Output = Result<Resolved, RoutingError>> + Send + 'a {
        self.resolve_with(id, |lent| lent.to_resolved())
    }

    /// Resolves `id` as [`Self::resolve`] does and hands the answer to `use_route`,
    /// which must not keep it. A servable cache hit lends the cached document under the
    /// cache's pin and calls `use_route` at once, without an await point: the hit writes
    /// nothing other threads read (no lock word, no reference count), so threads
    /// resolving the same resources do not slow each other down.
    pub fn resolve_with<'a, R, F>(
        &'a self,
        id: &'a str,
        use_route: F,
    ) -> impl Future<Output = Result<R, RoutingError>> + Send + 'a
    where
        F: FnOnce(Lent<'_>) -> R + Send + 'a,
        R: Send + 'a,
    {
        let (use_route, looked) = match self.lend_hit(id, use_route) {
            Ok(answer) => return Either::Left(ready(Ok(answer))),
            Err(not_served) => not_served,
        };
        let fetched = match looked {
            Unserved::ReadThrough => Either::Left(self.read_write_region(id, Source::ReadThrough)),
            Unserved::Miss => Either::Right(self.resolve_from_store(id)),
        };
        Either::Right(async move { fetched.await.map(|resolved| use_route(resolved.as_lent())) }.boxed())
    }

    /// Calls `use_route` on the cache hit for `id`, the document lent under the cache's
    /// pin; when no tier may serve it, gives `use_route` back with what the cache found.
    fn lend_hit<R, F: FnOnce(Lent<'_>) -> R>(&self, id: &str, use_route: F) -> Result<R, (F, Unserved)> {
        let pinned = self.cache.pin();
        match pinned.lookup(id, self.clock.upper_unix_nanos()) {
            Lookup::Serve(record) => Ok(use_route(Lent { record, source: Source::Cache, store_time: Duration::ZERO })),
            Lookup::ReadThrough => Err((use_route, Unserved::ReadThrough)),
            Lookup::Miss => Err((use_route, Unserved::Miss)),
        }
    }

    async fn resolve_from_store(&self, id: &str) -> Result<Resolved, RoutingError> {
        let fetched = self.fetch_time();
        let started = Instant::now();
        let replica = match self.store.read_shared(id, ReadFrom::Replica).await {
            Ok(replica) => self.fresh_enough(started, replica)?,
            // A replica that lags may not have a new document yet; only the write region
            // can say that the resource does not exist.
            Err(StoreError::NotFound) => return self.read_write_region(id, Source::Store).await,
            Err(e) => return Err(e.into()),
        };
        let replica = self.settled(id, replica);
        let lagging = replica.doc.primary.lock.as_ref();
        if lagging.is_some_and(|l| freshness::replica_view_needs_write_region(l, fetched.0, &self.policy)) {
            // Never enforce on a replica's view of a lock: it may lag.
            return self.read_write_region(id, Source::ReadThrough).await;
        }
        self.remember(id, replica.clone(), fetched);
        Ok(Resolved { record: replica, source: Source::Store, store_time: started.elapsed() })
    }

    /// A read that took longer than [`ClientOptions::max_decision_age`] is not acted on.
    fn fresh_enough<T>(&self, started: Instant, read: T) -> Result<T, RoutingError> {
        let took = started.elapsed();
        if took > self.options.max_decision_age {
            return Err(RoutingError::Unavailable(format!(
                "the routing store answered after {:.3}s, later than the {:.3}s a decision may take",
                took.as_secs_f64(),
                self.options.max_decision_age.as_secs_f64()
            )));
        }
        Ok(read)
    }

    /// [`Self::resolve_or_create`], the answer handed to `use_route` as in
    /// [`Self::resolve_with`] (a cache hit is lent, not taken out).
    pub async fn resolve_or_create_with<R, F>(&self, id: &str, home: &str, use_route: F) -> Result<R, RoutingError>
    where
        F: FnOnce(Lent<'_>) -> R,
    {
        let use_route = match self.lend_hit(id, use_route) {
            Ok(answer) => return Ok(answer),
            Err((use_route, _)) => use_route,
        };
        let resolved = self.resolve_or_create(id, home).await?;
        Ok(use_route(resolved.as_lent()))
    }

    /// Resolves `id`, first creating its document at `home` if it has none.
    pub async fn resolve_or_create(&self, id: &str, home: &str) -> Result<Resolved, RoutingError> {
        match self.resolve(id).await {
            Err(RoutingError::NotFound) => {}
            other => return other,
        }
        let doc = LocationDocument::new(id, home);
        let fetched = self.fetch_time();
        let started = Instant::now();
        match self.store.create(&doc).await {
            Ok(committed) => {
                // A late answer is as stale a decision as a late read.
                let created = Versioned { doc, etag: committed.etag, committed_at: committed.committed_at };
                let record = Arc::new(self.fresh_enough(started, created)?);
                self.remember(id, record.clone(), fetched);
                Ok(Resolved { record, source: Source::Store, store_time: started.elapsed() })
            }
            // Someone else created it first: theirs is the document.
            Err(StoreError::Conflict) => self.read_write_region(id, Source::Store).await,
            // Our create may land yet; whatever the write region says now is the answer,
            // and if it has nothing yet, nothing was done for the caller either.
            Err(StoreError::OutcomeUnknown(why)) => match self.read_write_region(id, Source::Store).await {
                Err(RoutingError::NotFound) => Err(RoutingError::Unavailable(why)),
                other => other,
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Takes a pre-lock; the new token is in the grant and nowhere else.
    ///
    /// The lock restricts nothing before its `effectiveAt` (the grant + the declared
    /// convergence delay): every cache has seen it by then. Each later call presents
    /// the token and is one compare-and-set write.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use lockprobe::clock::ManualClock;
    /// use lockprobe::routing::{cache::TieredCache, ClientOptions, LockError, LockPolicy};
    /// use lockprobe::routing::{Phase, PreLockRequest, RoutingClient, RoutingError};
    /// use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let clock = Arc::new(ManualClock::at_epoch());
    /// let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    /// let ttl = Duration::from_secs(5);
    /// let policy = LockPolicy::declared(ttl, Duration::from_secs(1), Duration::from_secs(48 * 3600));
    /// let converged = policy.convergence_delay + policy.skew_margin;
    /// let client =
    ///     RoutingClient::new(store, clock.clone(), TieredCache::try_new(&[ttl])?, policy, ClientOptions::default());
    ///
    /// let request = PreLockRequest {
    ///     owner: "migration-7".into(),
    ///     duration: Duration::from_secs(3600),
    ///     target_location: Some("northeurope".into()),
    /// };
    /// let grant = client.pre_lock_or_create("user-42", "westeurope", &request).await?;
    ///
    /// // Too early: some cache may not show the lock yet.
    /// let early = client.escalate("user-42", &grant.token, Phase::HardDelete, Duration::from_secs(600)).await;
    /// assert!(matches!(early, Err(RoutingError::Lock(LockError::InvalidTransition(_)))), "{early:?}");
    ///
    /// clock.advance(converged);
    /// client.escalate("user-42", &grant.token, Phase::HardDelete, Duration::from_secs(600)).await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn pre_lock(&self, id: &str, req: &PreLockRequest) -> Result<Grant, RoutingError> {
        self.grant(id, None, req, None).await
    }

    /// Takes a pre-lock, creating the document at `home` in that same single write when
    /// the resource has none yet: a refused request then leaves no document behind.
    pub async fn pre_lock_or_create(&self, id: &str, home: &str, req: &PreLockRequest) -> Result<Grant, RoutingError> {
        self.grant(id, Some(home), req, None).await
    }

    /// [`Self::pre_lock_or_create`] under the caller's idempotency key: repeated with
    /// the same key and request, it returns the same token while that token holds the
    /// lock, and never a fresh lock.
    pub async fn pre_lock_with_key(
        &self,
        id: &str,
        home: &str,
        req: &PreLockRequest,
        key: Option<&str>,
    ) -> Result<Grant, RoutingError> {
        self.grant(id, Some(home), req, key).await
    }

    async fn grant(
        &self,
        id: &str,
        home: Option<&str>,
        req: &PreLockRequest,
        key: Option<&str>,
    ) -> Result<Grant, RoutingError> {
        let call = LockCall::PreLock { request: req.clone(), token: LockToken::generate() };
        let record = self.call(id, home, &call, key).await?;
        // A replay hands back the token the key's first call was granted.
        let token = record
            .doc
            .primary
            .lock
            .as_ref()
            .map(|l| l.token.clone())
            .ok_or(RoutingError::Lock(LockError::TokenMismatch))?;
        Ok(Grant { record, token })
    }

    /// Escalates to `phase` with a lease of `duration`.
    pub async fn escalate(
        &self,
        id: &str,
        token: &LockToken,
        phase: Phase,
        duration: Duration,
    ) -> Result<Arc<Versioned>, RoutingError> {
        self.call(id, None, &LockCall::Escalate { token: token.clone(), phase, duration }, None).await
    }

    /// Renews the lease by `duration` (capped by the parent lease and the maximum).
    pub async fn renew(&self, id: &str, token: &LockToken, duration: Duration) -> Result<Arc<Versioned>, RoutingError> {
        self.call(id, None, &LockCall::Renew { token: token.clone(), duration }, None).await
    }

    /// Switches the location to `target` and clears the lock in one write.
    pub async fn swap(&self, id: &str, token: &LockToken, target: &str) -> Result<Arc<Versioned>, RoutingError> {
        self.swap_with_key(id, token, target, None).await
    }

    /// [`Self::swap`] under the caller's idempotency key.
    pub async fn swap_with_key(
        &self,
        id: &str,
        token: &LockToken,
        target: &str,
        key: Option<&str>,
    ) -> Result<Arc<Versioned>, RoutingError> {
        self.call(id, None, &LockCall::Swap { token: token.clone(), target: target.to_owned() }, key).await
    }

    /// Releases the lock; the location is unchanged.
    pub async fn release(&self, id: &str, token: &LockToken) -> Result<Arc<Versioned>, RoutingError> {
        self.call(id, None, &LockCall::Release { token: token.clone() }, None).await
    }

    /// Reads the authoritative document and checks that the swap of `token` to
    /// `target` would be accepted now, without writing: the copy of user data that must
    /// happen under the write lock before the swap then runs only for a swap that can
    /// succeed, and never copies to a target the swap would refuse. Returns once no
    /// operation decided before the write lock began can still be applied (the decision
    /// age, plus the skew margin between the store's clock and this one), so the copy
    /// sees every write that was accepted. A swap this key already made is reported as
    /// such: nothing is copied again.
    pub async fn prepare_swap(
        &self,
        id: &str,
        token: &LockToken,
        target: &str,
        key: Option<&str>,
    ) -> Result<SwapPlan, RoutingError> {
        let call = LockCall::Swap { token: token.clone(), target: target.to_owned() };
        let key = key.map(|k| format!("k:{k}")).unwrap_or_else(|| "w:check".into());
        let fetched = self.fetch_time();
        let record = self.read_settled(id).await?;
        // Cached, so the swap that follows reads this version back without settling it
        // again ([`Self::settled`]); a write lock is never served from the cache.
        self.remember(id, record.clone(), fetched);
        match lifecycle::decide(&record.doc, &call, &key, &self.policy, self.clock.now())? {
            Decided::Replayed => return Ok(SwapPlan::AlreadySwapped(record)),
            Decided::Write(_) => {}
        }
        let since = record.doc.primary.lock.as_ref().and_then(|l| l.phase_since).unwrap_or(record.committed_at);
        let quiet = since
            .checked_add_signed(to_chrono(self.options.max_decision_age + self.policy.skew_margin))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let wait = span(self.clock.now(), quiet);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(SwapPlan::Copy(record))
    }

    /// The authoritative document of `id`, read from the write region now, settled and
    /// not cached: how the lock-record design checks a lock record on every user
    /// operation. A read slower than the decision age is refused like any other.
    pub async fn read_uncached(&self, id: &str) -> Result<Resolved, RoutingError> {
        let started = Instant::now();
        let read = self.store.read_shared(id, ReadFrom::WriteRegion).await?;
        let record = self.settled(id, self.fresh_enough(started, read)?);
        Ok(Resolved { record, source: Source::ReadThrough, store_time: started.elapsed() })
    }

    /// Moves `id`'s document to `location` (creating it there if it has none), leaving
    /// everything else as it is, by compare-and-set; no write when it is there already.
    /// The lock-record design's swap: its lock record is swapped by the lifecycle, then
    /// the routing document follows with this second write.
    pub async fn publish_location(&self, id: &str, location: &str) -> Result<Arc<Versioned>, RoutingError> {
        for _ in 0..self.options.retry_budget {
            let fetched = self.fetch_time();
            let (mut doc, etag) = match self.read_settled(id).await {
                Ok(current) if current.doc.primary.location == location => return Ok(current),
                Ok(current) => (current.doc.clone(), Some(current.etag.clone())),
                Err(RoutingError::NotFound) => (LocationDocument::new(id, location), None),
                Err(e) => return Err(e),
            };
            doc.primary.location = location.to_owned();
            let written = match &etag {
                Some(etag) => self.store.replace(&doc, etag).await,
                None => self.store.create(&doc).await,
            };
            match written {
                Ok(committed) => {
                    self.committed(&doc);
                    let record =
                        Arc::new(Versioned { doc, etag: committed.etag, committed_at: committed.committed_at });
                    self.remember(id, record.clone(), fetched);
                    return Ok(record);
                }
                Err(StoreError::PreconditionFailed | StoreError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RoutingError::RetryExhausted { attempts: self.options.retry_budget })
    }

    /// The authoritative document, settled.
    async fn read_settled(&self, id: &str) -> Result<Arc<Versioned>, RoutingError> {
        let read = self.store.read_shared(id, ReadFrom::WriteRegion).await?;
        Ok(self.settled(id, read))
    }

    /// `read` as every reader must take it ([`lifecycle::settle`]): as read when it
    /// carries no pending record; the settled copy this instance's cache holds of that
    /// very version, if it holds one (an ETag names one version, and settling depends
    /// on the version alone: a lock call reads back what the last one wrote), which
    /// spares copying and hashing it again; a settled copy otherwise.
    fn settled(&self, id: &str, read: Arc<Versioned>) -> Arc<Versioned> {
        if read.doc.pending.is_none() {
            return read;
        }
        if let Some(known) = self.cache.version(id, &read.etag) {
            return known;
        }
        let doc = lifecycle::settle(read.doc.clone(), read.committed_at);
        Arc::new(Versioned { doc, etag: read.etag.clone(), committed_at: read.committed_at })
    }

    /// Caches `record`, fetched at `fetched`, under the freshness rule
    /// ([`freshness::serve_until`]).
    fn remember(&self, id: &str, record: Arc<Versioned>, (fetched, fetched_ns): (DateTime<Utc>, i64)) {
        let serve_until = unix_nanos(freshness::serve_until(&record.doc, fetched, &self.policy));
        self.cache.put(id, record, fetched_ns, serve_until);
    }

    /// The fetch time of a document about to be read: as a date for lock arithmetic, and
    /// in nanoseconds for the cache. Taken before the read, so an entry never outlives
    /// its TTL.
    fn fetch_time(&self) -> (DateTime<Utc>, i64) {
        let now = self.clock.now();
        (now, unix_nanos(now))
    }

    /// Reads the authoritative copy and caches it. `source` says why: a read-through of a
    /// started lock, or a plain store read that a replica could not answer (a document
    /// too new for it, or one another instance has just created); only the former is
    /// reported as `read-through`, so that figure stays the lock's cost.
    async fn read_write_region(&self, id: &str, source: Source) -> Result<Resolved, RoutingError> {
        let fetched = self.fetch_time();
        let started = Instant::now();
        let read = self.store.read_shared(id, ReadFrom::WriteRegion).await?;
        let record = self.settled(id, self.fresh_enough(started, read)?);
        let store_time = started.elapsed();
        self.remember(id, record.clone(), fetched);
        Ok(Resolved { record, source, store_time })
    }

    /// Makes a lock call under idempotency key `key` (the caller's, or a fresh one).
    ///
    /// Read the settled document from the write region, decide, write-if-match (or
    /// create-if-absent at `home`), and judge the written version by its commit time.
    /// A 412 or 409 re-reads and re-decides; the decision then recognises a write of
    /// this call that landed (a store's internal retry can answer 412 to its own
    /// write). A write whose outcome is unknown is resolved by the next read: if the
    /// document still stands at the version the write was conditional on, the write may
    /// yet land and the outcome stays unknown; otherwise it either landed (its record is
    /// there) or never can (its condition is gone), and the decision proceeds.
    pub async fn call(
        &self,
        id: &str,
        home: Option<&str>,
        call: &LockCall,
        key: Option<&str>,
    ) -> Result<Arc<Versioned>, RoutingError> {
        let key = match key {
            Some(k) => format!("k:{k}"),
            None => format!("w:{}", document::to_hex(&rand::random::<[u8; 8]>())),
        };
        self.write_loop(id, home, &Call::Lock { call, key: &key }).await
    }

    /// Makes a force-release call ([`force_release`]): a request, or a second person's
    /// approval, written in the same compare-and-set loop as every lock call. The
    /// request's id is its idempotency key: a repeat, or a retry after an ambiguous
    /// answer, finds what the first call did. An approval that found the lock changed
    /// is written too (the request closes as `void`), and returned like one that
    /// released it: the record in the document says which.
    pub async fn force_release(&self, id: &str, call: &AdminCall) -> Result<Arc<Versioned>, RoutingError> {
        self.write_loop(id, None, &Call::Admin(call)).await
    }

    /// The loop of [`Self::call`] and [`Self::force_release`].
    async fn write_loop(&self, id: &str, home: Option<&str>, call: &Call<'_>) -> Result<Arc<Versioned>, RoutingError> {
        // A write whose outcome the store left unknown: the version it was conditioned on,
        // why, and what it wrote (seen by the observer if a re-read finds it landed).
        let mut unresolved: Option<(Option<ETag>, String, LocationDocument)> = None;
        for _ in 0..self.options.retry_budget {
            let (base, etag) = match (self.read_settled(id).await, home) {
                (Ok(current), _) => (current, true),
                (Err(RoutingError::NotFound), Some(home)) => {
                    let fresh = LocationDocument::new(id, home);
                    let fresh =
                        Versioned { doc: fresh, etag: ETag(String::new()), committed_at: DateTime::<Utc>::MIN_UTC };
                    (Arc::new(fresh), false)
                }
                (Err(e), _) => return Err(unresolved.map_or(e, |(_, why, _)| RoutingError::OutcomeUnknown(why))),
            };
            let condition = etag.then(|| base.etag.clone());
            if let Some((written_on, why, _)) = &unresolved {
                if *written_on == condition && !call.took_effect(&base.doc) {
                    // Still at the version the write needs: it may land yet.
                    return Err(RoutingError::OutcomeUnknown(why.clone()));
                }
            }
            let next = match call.decide(&base.doc, &self.policy, self.clock.now())? {
                Decided::Replayed => {
                    // The key's record is there: if this call left a write unresolved,
                    // that write landed (a key's record is written once; in the rare race
                    // with an earlier call under the same key whose late write won
                    // instead, the observer sees this call's version of the same change).
                    if let Some((_, _, landed)) = &unresolved {
                        self.committed(landed);
                    }
                    return Ok(base);
                }
                Decided::Write(next) => *next,
            };
            // Taken before the write is sent, like every fetch time: an acknowledgement that
            // arrives late must not make the cached version look younger than it is.
            let fetched = self.fetch_time();
            let written = match &condition {
                Some(etag) => self.store.replace(&next, etag).await,
                None => self.store.create(&next).await,
            };
            match written {
                Ok(committed) => {
                    self.committed(&next);
                    return self.judge(id, next, committed, call, fetched);
                }
                Err(StoreError::PreconditionFailed) if condition.is_some() => unresolved = None,
                Err(StoreError::Conflict) if condition.is_none() => unresolved = None,
                Err(StoreError::OutcomeUnknown(why)) => unresolved = Some((condition, why, next)),
                Err(e) => return Err(e.into()),
            }
        }
        match unresolved {
            Some((_, why, _)) => Err(RoutingError::OutcomeUnknown(why)),
            None => Err(RoutingError::RetryExhausted { attempts: self.options.retry_budget }),
        }
    }

    /// The written version as every reader will take it: a call that landed after the
    /// lease it relied on took no effect, and its caller hears that the lease expired.
    fn judge(
        &self,
        id: &str,
        written: LocationDocument,
        committed: Committed,
        call: &Call<'_>,
        fetched: (DateTime<Utc>, i64),
    ) -> Result<Arc<Versioned>, RoutingError> {
        let lease_end = written.pending.as_ref().and_then(|p| p.void_if_committed_after);
        // Settled as decided: this is the document `decide` sealed, not one read back.
        let doc = lifecycle::settle_own_write(written, committed.committed_at);
        let record = Arc::new(Versioned { doc, etag: committed.etag, committed_at: committed.committed_at });
        self.remember(id, record.clone(), fetched);
        if !call.took_effect(&record.doc) {
            let expired_at = lease_end.unwrap_or(committed.committed_at);
            return Err(RoutingError::Lock(LockError::LeaseExpired { expired_at }));
        }
        Ok(record)
    }
}

/// What [`RoutingClient::write_loop`] decides and then looks for in what it reads back.
enum Call<'a> {
    /// A lock call under its idempotency key (`k:` or `w:`).
    Lock { call: &'a LockCall, key: &'a str },
    /// A force-release call, recognised by its request's id.
    Admin(&'a AdminCall),
}

impl Call<'_> {
    fn decide(&self, doc: &LocationDocument, policy: &LockPolicy, now: DateTime<Utc>) -> Result<Decided, LockError> {
        match self {
            Call::Lock { call, key } => lifecycle::decide(doc, call, key, policy, now),
            Call::Admin(call) => force_release::decide(doc, call, policy, now),
        }
    }

    fn took_effect(&self, doc: &LocationDocument) -> bool {
        match self {
            Call::Lock { key, .. } => lifecycle::took_effect(doc, key),
            Call::Admin(call) => force_release::took_effect(doc, call),
        }
    }
}
