//! The routing library: the lock itself, over the location document
//! ([`crate::document`], re-exported here for a service that links only this).
//!
//! - [`lifecycle`]: pre-lock, escalate, renew, swap, release as pure functions.
//! - [`force_release`]: an operator's removal of a stuck lock, requested by one
//!   principal and approved by another, as pure functions too.
//! - [`mod@enforce`]: operation x resolved lock state -> allow / block / tombstone.
//! - [`freshness`]: when a cached or replicated view may be acted on.
//! - [`cache`]: tiered TTL cache.
//! - [`client`]: `RoutingClient`, resolve with read-through and the lock operations.

pub mod cache;
pub mod client;
pub mod enforce;
pub mod force_release;
pub mod freshness;
pub mod lifecycle;

pub use crate::document::{LocationDocument, LockInfo, LockToken, Phase};
pub use client::{ClientOptions, CommitObserver, Grant, Lent, Resolved, RoutingClient, RoutingError, Source, SwapPlan};
pub use enforce::{enforce, Decision, Operation};
pub use lifecycle::{Deviations, LockCall, LockError, LockPolicy, PreLockRequest};
