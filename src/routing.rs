//! The routing library: the lock itself.
//!
//! - [`document`]: the location document (schema, versioning, lock token).
//! - [`lifecycle`]: pre-lock, escalate, renew, swap, release as pure functions.
//! - [`enforce`]: operation x resolved lock state -> allow / block / tombstone.
//! - [`cache`]: tiered TTL cache.
//! - [`client`]: `RoutingClient`, resolve with read-through and the lock operations.

pub mod cache;
pub mod client;
pub mod document;
pub mod enforce;
pub mod lifecycle;

use std::time::Duration;

pub use client::{ClientOptions, Grant, Resolved, RoutingClient, RoutingError, Source};
pub use document::{LocationDocument, LockInfo, LockToken, Phase};
pub use enforce::{enforce, Decision, Operation};
pub use lifecycle::{LockError, LockPolicy, PreLockRequest};

impl LockPolicy {
    /// The honest declaration: convergence delay = largest cache TTL + replication bound.
    pub fn declared(max_cache_ttl: Duration, replication_bound: Duration, max_pre_lock: Duration) -> Self {
        Self { convergence_delay: max_cache_ttl + replication_bound, max_pre_lock }
    }
}
