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
//! - [`status_page`]: the human status page at `/`, rendered from the status API's JSON.

pub mod status_page;
