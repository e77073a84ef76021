//! Where a resource's lock lives: the two designs the service can run, behind one set
//! of handlers, so they can be measured head to head (`lockprobe bench`).
//!
//! - [`LockDesign::Embedded`] (the default, the paper's design): the lock is part of the
//!   routing document. A user operation resolves that document through the cache tiers
//!   and reads the write region only while a lock has started.
//! - [`LockDesign::Record`] (the baseline, DynamoDB Lock Client style): each resource's
//!   lock lives in its own document, `lock:<id>` in the same store
//!   ([`lock_record_id`]), under the same lifecycle (the routing library's, token,
//!   ETag, idempotency and commit-time rules unchanged: the lock calls are the same
//!   calls on the lock record). Every user operation reads the lock record from the
//!   write region, with no lock cache (a cache would have to bound its staleness as the
//!   embedded design does, which is the embedded design); routing documents keep the
//!   same cache tiers. The lock record also carries the location its lock governs (set
//!   from the routing document when it is created, moved by the swap in the same write
//!   that clears the lock), so that a cached routing document that has not yet seen a
//!   swap is never acted on: on a resource with a lock record, the record's location
//!   wins. The routing document follows a swap with a second write
//!   ([`Instance::follow_lock_record`]); a fault or a crash between the two leaves it
//!   behind without harm (`docs/faults.md`).
//!
//! In the record design, ids starting with [`LOCK_RECORD_PREFIX`] are refused (400):
//! they would name another resource's lock record.

use std::time::Duration;

use super::error::ApiError;
use super::input;
use super::Instance;
use crate::document::{lock_record_id, LOCK_RECORD_PREFIX};
use crate::routing::{Lent, LockInfo, Resolved, RoutingError, Source};

/// Where locks live; see the module documentation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockDesign {
    /// The lock is embedded in the routing document (cached with it).
    #[default]
    Embedded,
    /// The lock lives in its own record, read from the write region on every operation.
    Record,
}

impl LockDesign {
    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            LockDesign::Embedded => "embedded",
            LockDesign::Record => "record",
        }
    }
}

impl std::fmt::Display for LockDesign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many times [`Instance::follow_lock_record`] moves the routing document after a
/// lock record that keeps moving (each round is a whole migration elsewhere).
const FOLLOW_ROUNDS: usize = 3;

/// What a user operation acts on: the location and the lock, however the design found
/// them. Lent to the operation ([`Instance::route_with`]): on a cache hit it borrows the
/// cached document.
#[derive(Debug, Clone, Copy)]
pub struct Routed<'r> {
    /// The document whose location is acted on: the routing document, or in the record
    /// design the lock record when the resource has one.
    at: Lent<'r>,
    /// Whether `at` carries the lock (false: the record design found no lock record).
    lock_in_at: bool,
    /// Which way the decision went, for `Server-Timing`.
    pub source: Source,
    /// Time spent in store reads.
    pub store_time: Duration,
    /// Time spent reading the lock record (record design only).
    pub lock_time: Option<Duration>,
}

impl<'r> Routed<'r> {
    fn embedded(route: Lent<'r>) -> Self {
        Self { source: route.source, store_time: route.store_time, at: route, lock_in_at: true, lock_time: None }
    }

    /// The location to act on.
    pub fn location(&self) -> &'r str {
        &self.at.record.doc.primary.location
    }

    /// The lock as resolved (possibly expired; `enforce` decides).
    pub fn lock(&self) -> Option<&'r LockInfo> {
        self.at.record.doc.primary.lock.as_ref().filter(|_| self.lock_in_at)
    }

    /// The lock if its lease has not lapsed at `now`.
    pub fn live_lock(&self, now: chrono::DateTime<chrono::Utc>) -> Option<&'r LockInfo> {
        self.lock().filter(|l| l.is_live(now))
    }
}

/// The record design's answer, owned until it is lent as a [`Routed`].
struct RecordRoute {
    at: Resolved,
    lock_in_at: bool,
    source: Source,
    store_time: Duration,
    lock_time: Duration,
}

impl Instance {
    /// The id lock calls act on: the resource's own document, or its lock record.
    pub fn lock_document_id(&self, id: &str) -> String {
        match self.config.lock_design {
            LockDesign::Embedded => id.to_owned(),
            LockDesign::Record => lock_record_id(id),
        }
    }

    /// Checks a resource id: the contract's rule, and in the record design not a lock
    /// record's id.
    pub fn check_resource_id(&self, id: &str) -> Result<(), ApiError> {
        input::check_name("resource id", id)?;
        if self.config.lock_design == LockDesign::Record && id.starts_with(LOCK_RECORD_PREFIX) {
            return Err(ApiError::bad_request(format!(
                "resource ids starting with {LOCK_RECORD_PREFIX:?} are reserved for lock records in this lock design"
            )));
        }
        Ok(())
    }

    /// Resolves what a user operation on `id` acts on and runs `act` on it; with
    /// `create`, a resource with no routing document gets one (at its lock record's
    /// location, or home). `act` runs synchronously on the answer as lent by
    /// [`crate::routing::RoutingClient::resolve_with`], so a cache hit takes no
    /// reference on the cached document.
    pub async fn route_with<R, F>(&self, id: &str, create: bool, act: F) -> Result<R, RoutingError>
    where
        F: FnOnce(&Routed<'_>) -> R + Send,
        R: Send,
    {
        let routing = &self.routing;
        if self.config.lock_design == LockDesign::Embedded {
            let act = |lent: Lent<'_>| act(&Routed::embedded(lent));
            return if create {
                routing.resolve_or_create_with(id, &self.config.home_location, act).await
            } else {
                routing.resolve_with(id, act).await
            };
        }
        let r = self.route_by_record(id, create).await?;
        let routed = Routed {
            at: r.at.as_lent(),
            lock_in_at: r.lock_in_at,
            source: r.source,
            store_time: r.store_time,
            lock_time: Some(r.lock_time),
        };
        Ok(act(&routed))
    }

    /// The record design's routing: the lock record (from the write region) and the
    /// routing document (through the cache), read side by side.
    async fn route_by_record(&self, id: &str, create: bool) -> Result<RecordRoute, RoutingError> {
        let routing = &self.routing;
        let home = &self.config.home_location;
        // Both reads at once: the lock record's is the one the design adds, and a
        // client of it would not wait for the (mostly cached) route before sending it.
        let lock_id = lock_record_id(id);
        let (lock_record, route) = futures::join!(routing.read_uncached(&lock_id), routing.resolve(id));
        let lock_record = match lock_record {
            Ok(record) => Some(record),
            Err(RoutingError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let route = match route {
            Ok(route) => Some(route),
            Err(RoutingError::NotFound) if create => {
                let at = lock_record.as_ref().map_or(home.as_str(), |r| r.location());
                Some(routing.resolve_or_create(id, at).await?)
            }
            Err(RoutingError::NotFound) if lock_record.is_some() => None,
            Err(e) => return Err(e),
        };
        let lock_time = lock_record.as_ref().map_or(Duration::ZERO, |r| r.store_time);
        let route_time = route.as_ref().map_or(Duration::ZERO, |r| r.store_time);
        let now = routing.clock().now();
        let skew = chrono::TimeDelta::from_std(routing.policy().skew_margin).unwrap_or(chrono::TimeDelta::MAX);
        // The lock decision came from the write region; say so while it restricts, as
        // the embedded design's read-through does.
        let started = lock_record.as_ref().and_then(|r| r.lock()).is_some_and(|l| l.is_started(now, skew));
        let route_source = route.as_ref().map_or(Source::Store, |r| r.source);
        let source = if started { Source::ReadThrough } else { route_source };
        let (at, lock_in_at) = match (lock_record, route) {
            (Some(record), _) => (record, true),
            (None, Some(route)) => (route, false),
            (None, None) => return Err(RoutingError::NotFound),
        };
        // The two reads ran side by side: the operation waited for the slower.
        let store_time = lock_time.max(route_time);
        Ok(RecordRoute { at, lock_in_at, source, store_time, lock_time })
    }

    /// In the record design, brings the routing document to `at`, the location its lock
    /// record holds after a swap (or the repeat of one); nothing in the embedded design.
    ///
    /// The lock record is the authority on location from its creation on, and the
    /// routing document only follows it: a fault or a crash between the swap's two writes
    /// leaves the routing document behind, which no instance acts on (the record's
    /// location wins). So the routing document is moved to where the lock record says,
    /// never to a swap's own target, which a later migration may have moved on from; and
    /// after each move the record is read again, since a move held up in the store can
    /// land after a later swap found the routing document where it wanted it and wrote
    /// nothing: the mover then corrects its own stale write.
    pub async fn follow_lock_record(&self, id: &str, at: &str) -> Result<(), RoutingError> {
        if self.config.lock_design != LockDesign::Record {
            return Ok(());
        }
        let lock_id = lock_record_id(id);
        let mut at = at.to_owned();
        for _ in 0..FOLLOW_ROUNDS {
            self.routing.publish_location(id, &at).await?;
            let now_at = self.routing.read_uncached(&lock_id).await?.location().to_owned();
            if now_at == at {
                return Ok(());
            }
            at = now_at;
        }
        Ok(())
    }

    /// Where a new lock record starts: where the routing document says the resource
    /// is now (home for a resource without one).
    pub async fn lock_record_home(&self, id: &str) -> Result<String, RoutingError> {
        match self.routing.read_uncached(id).await {
            Ok(route) => Ok(route.location().to_owned()),
            Err(RoutingError::NotFound) => Ok(self.config.home_location.clone()),
            Err(e) => Err(e),
        }
    }
}
