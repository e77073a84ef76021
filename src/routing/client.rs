//! `RoutingClient`: what a service links to resolve routes and mutate locks.
//!
//! Resolve goes through the tiered cache; a cached document carrying a started lock
//! is re-read from the write region (never a replica) on every resolve. Lock
//! operations read from the write region, apply a pure lifecycle transition and write
//! it back with If-Match on the ETag read; on 412 they re-read and re-decide, up to a
//! retry budget. A successful operation makes exactly one write.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use futures::future::{ready, Either, FutureExt};

use super::cache::{Lookup, TieredCache};
use super::document::{DocumentError, LocationDocument, LockInfo, LockToken, Phase};
use super::lifecycle::{self, LockError, LockPolicy, PreLockRequest};
use crate::clock::{to_chrono, unix_nanos, Clock};
use crate::store::{LocationStore, ReadFrom, StoreError, Versioned};

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
}

/// A granted pre-lock: the document written and the token, for the caller only.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The document as written.
    pub record: Versioned,
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
    /// The stored document is unusable by this version.
    #[error(transparent)]
    Document(#[from] DocumentError),
}

impl From<StoreError> for RoutingError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => RoutingError::NotFound,
            StoreError::Unavailable(m) => RoutingError::Unavailable(m),
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
    /// Attempts per lock operation when writes race (412).
    pub retry_budget: u32,
    /// A lock this close to its effectiveAt already counts as started, to absorb clock
    /// skew between the service that computed effectiveAt and this one.
    pub skew_margin: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self { retry_budget: 8, skew_margin: Duration::from_millis(500) }
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
        Self { store, clock, cache, policy, options }
    }

    /// The lock policy (declared convergence delay, maximum pre-lock).
    pub fn policy(&self) -> &LockPolicy {
        &self.policy
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
    /// an await point or allocation; misses and read-throughs go to the store.
    pub fn resolve<'a>(&'a self, id: &'a str) -> impl Future<Output = Result<Resolved, RoutingError>> + Send + 'a {
        match self.cache.lookup(id, self.clock.now_unix_nanos()) {
            Lookup::Serve(record) => {
                Either::Left(ready(Ok(Resolved { record, source: Source::Cache, store_time: Duration::ZERO })))
            }
            Lookup::ReadThrough => Either::Right(self.read_write_region(id, Source::ReadThrough).boxed()),
            Lookup::Miss => Either::Right(self.resolve_from_store(id).boxed()),
        }
    }

    async fn resolve_from_store(&self, id: &str) -> Result<Resolved, RoutingError> {
        let fetched = self.fetch_time();
        let now = fetched.0;
        let started = Instant::now();
        let replica = match self.store.read(id, ReadFrom::Replica).await {
            Ok(replica) => replica,
            // A replica that lags may not have a new document yet; only the write region
            // can say that the resource does not exist.
            Err(StoreError::NotFound) => return self.read_write_region(id, Source::Store).await,
            Err(e) => return Err(e.into()),
        };
        if replica.doc.primary.lock.as_ref().is_some_and(|l| self.replica_may_lag_on(l, now)) {
            // Never enforce on a replica's view of a lock: it may lag.
            return self.read_write_region(id, Source::ReadThrough).await;
        }
        let record = Arc::new(replica);
        self.remember(id, record.clone(), fetched);
        Ok(Resolved { record, source: Source::Store, store_time: started.elapsed() })
    }

    /// Resolves `id`, first creating its document at `home` if it has none.
    pub async fn resolve_or_create(&self, id: &str, home: &str) -> Result<Resolved, RoutingError> {
        match self.resolve(id).await {
            Err(RoutingError::NotFound) => {}
            other => return other,
        }
        let doc = LocationDocument::new(id, home);
        match self.store.create(&doc).await {
            Ok(etag) => {
                let record = Arc::new(Versioned { doc, etag });
                self.remember(id, record.clone(), self.fetch_time());
                Ok(Resolved { record, source: Source::Store, store_time: Duration::ZERO })
            }
            // Someone else created it first: theirs is the document.
            Err(StoreError::Conflict) => self.read_write_region(id, Source::Store).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Takes a pre-lock; the new token is in the grant and nowhere else.
    pub async fn pre_lock(&self, id: &str, req: &PreLockRequest) -> Result<Grant, RoutingError> {
        self.grant(id, None, req).await
    }

    /// Takes a pre-lock, creating the document at `home` in that same single write when
    /// the resource has none yet: a refused request then leaves no document behind.
    pub async fn pre_lock_or_create(&self, id: &str, home: &str, req: &PreLockRequest) -> Result<Grant, RoutingError> {
        self.grant(id, Some(home), req).await
    }

    async fn grant(&self, id: &str, home: Option<&str>, req: &PreLockRequest) -> Result<Grant, RoutingError> {
        let token = LockToken::generate();
        let policy = self.policy.clone();
        let record = self
            .mutate_or_create(id, home, |doc, now| lifecycle::pre_lock(doc, req, token.clone(), &policy, now))
            .await?;
        Ok(Grant { record, token })
    }

    /// Escalates to `phase` with a lease of `duration`.
    pub async fn escalate(&self, id: &str, token: &LockToken, phase: Phase, duration: Duration) -> Result<Versioned, RoutingError> {
        self.mutate(id, |doc, now| lifecycle::escalate(doc, token, phase, duration, now)).await
    }

    /// Renews the lease by `duration` (capped by the parent lease and the maximum).
    pub async fn renew(&self, id: &str, token: &LockToken, duration: Duration) -> Result<Versioned, RoutingError> {
        self.mutate(id, |doc, now| lifecycle::renew(doc, token, duration, now)).await
    }

    /// Switches the location to `target` and clears the lock in one write.
    pub async fn swap(&self, id: &str, token: &LockToken, target: &str) -> Result<Versioned, RoutingError> {
        self.mutate(id, |doc, now| lifecycle::swap(doc, token, target, now)).await
    }

    /// Releases the lock; the location is unchanged.
    pub async fn release(&self, id: &str, token: &LockToken) -> Result<Versioned, RoutingError> {
        self.mutate(id, |doc, now| lifecycle::release(doc, token, now)).await
    }

    /// Reads the authoritative document and checks that the swap of `token` to
    /// `target` would be accepted now, without writing: the copy of user data that must
    /// happen under the write lock before the swap then runs only for a swap that can
    /// succeed, and never copies to a target the swap would refuse.
    pub async fn check_swap(&self, id: &str, token: &LockToken, target: &str) -> Result<Versioned, RoutingError> {
        let record = self.store.read(id, ReadFrom::WriteRegion).await?;
        lifecycle::swap(&record.doc, token, target, self.clock.now())?;
        Ok(record)
    }

    /// Whether a replica's view of `lock` could differ from the write region's in a way
    /// that matters: the lock has started, and it is live or lapsed so recently that a
    /// renewal made before the lapse may not have replicated yet (the lock's declared
    /// convergence delay covers the replication bound). Long-lapsed locks are final.
    fn replica_may_lag_on(&self, lock: &LockInfo, now: DateTime<Utc>) -> bool {
        self.has_started(lock, now) && now < lock.expires_at + lock.convergence_delay()
    }

    fn has_started(&self, lock: &LockInfo, now: DateTime<Utc>) -> bool {
        lock.effective_at <= now + to_chrono(self.options.skew_margin)
    }

    /// Caches `record`, fetched at `fetched`. It may be served until its lock (if any)
    /// starts; a document carrying a started lock that was live when fetched is never
    /// served from cache, since that lock may since have been escalated, renewed or
    /// swapped and only the write region can say what holds now. A lock that had lapsed
    /// (by more than the skew margin) when the document was fetched is final: an
    /// expired token can do nothing.
    fn remember(&self, id: &str, record: Arc<Versioned>, (fetched, fetched_ns): (DateTime<Utc>, i64)) {
        let serve_until = match &record.doc.primary.lock {
            // Within the skew margin of its end a lease may still be live by another
            // clock (and be renewed), so only a lock lapsed by more than that is final.
            Some(lock) if lock.expires_at + to_chrono(self.options.skew_margin) > fetched => {
                unix_nanos(lock.effective_at - to_chrono(self.options.skew_margin))
            }
            _ => i64::MAX,
        };
        self.cache.put(id, record, fetched_ns, serve_until);
    }

    /// The fetch time of a document about to be read: as a date for lock arithmetic, and
    /// on the cache's own (possibly coarse) clock, so entries age on the clock that
    /// checks them. Taken before the read, so an entry never outlives its TTL.
    fn fetch_time(&self) -> (DateTime<Utc>, i64) {
        (self.clock.now(), self.clock.now_unix_nanos())
    }

    /// Reads the authoritative copy and caches it. `source` says why: a read-through of a
    /// started lock, or a plain store read that a replica could not answer (a document
    /// too new for it, or one another instance has just created); only the former is
    /// reported as `read-through`, so that figure stays the lock's cost.
    async fn read_write_region(&self, id: &str, source: Source) -> Result<Resolved, RoutingError> {
        let fetched = self.fetch_time();
        let started = Instant::now();
        let record = Arc::new(self.store.read(id, ReadFrom::WriteRegion).await?);
        let store_time = started.elapsed();
        self.remember(id, record.clone(), fetched);
        Ok(Resolved { record, source, store_time })
    }

    /// Read, decide, write-if-match; on 412 re-read and re-decide.
    async fn mutate<F>(&self, id: &str, decide: F) -> Result<Versioned, RoutingError>
    where
        F: Fn(&LocationDocument, DateTime<Utc>) -> Result<LocationDocument, LockError>,
    {
        self.mutate_or_create(id, None, decide).await
    }

    /// [`Self::mutate`]; with `home`, a missing document is decided on as a new one at
    /// `home` and written with create-if-absent, where losing the race to create (409)
    /// re-reads and re-decides like a 412.
    async fn mutate_or_create<F>(&self, id: &str, home: Option<&str>, decide: F) -> Result<Versioned, RoutingError>
    where
        F: Fn(&LocationDocument, DateTime<Utc>) -> Result<LocationDocument, LockError>,
    {
        for _ in 0..self.options.retry_budget {
            let (current, etag) = match (self.store.read(id, ReadFrom::WriteRegion).await, home) {
                (Ok(current), _) => (current.doc, Some(current.etag)),
                (Err(StoreError::NotFound), Some(home)) => (LocationDocument::new(id, home), None),
                (Err(e), _) => return Err(e.into()),
            };
            let next = decide(&current, self.clock.now())?;
            let written = match &etag {
                Some(etag) => self.store.replace(&next, etag).await,
                None => self.store.create(&next).await,
            };
            match written {
                Ok(etag) => {
                    let written = Versioned { doc: next, etag };
                    self.remember(id, Arc::new(written.clone()), self.fetch_time());
                    return Ok(written);
                }
                Err(StoreError::PreconditionFailed) if etag.is_some() => continue,
                Err(StoreError::Conflict) if etag.is_none() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RoutingError::RetryExhausted { attempts: self.options.retry_budget })
    }
}
