//! lockprobe: synthetic probes and convergence monitoring for routing-embedded
//! migration locks.
//!
//! Layers, bottom up (each only imports the ones above it):
//!
//! - [`clock`]: the one source of time; a system clock and a manual clock.
//! - [`routing::document`]: the location document and its schema versioning.
//! - [`store`]: the `LocationStore` trait and its backends (in-memory, Cosmos DB).
//! - [`routing`]: the lock lifecycle (pure), enforcement, the tiered cache and the
//!   `RoutingClient` a service links.
//! - [`store`]: the `LocationStore` trait; [`store::memory`] is the embedded default.
//! - [`service`]: the reference service speaking the probe contract over the routing library.
//! - [`usage`]: command-line usage errors (exit 64).
//! - [`monitor`]: the convergence monitor over the store's change stream.

pub mod clock;
pub mod monitor;
pub mod routing;
pub mod service;
pub mod store;
pub mod usage;
