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
//! - [`probe`]: the black-box probe: contract client, cycle scenario, scheduler, reports,
//!   state file; speaks only HTTP to the service it judges.
//! - [`config`]: the TOML configuration of `serve`, validated with errors naming the field.
//! - [`metrics`]: the probe's Prometheus registry and exact HDR percentiles.
//! - [`server`]: the probe's HTTP server: `/metrics`, `/healthz`, `/readyz`, `/api/v1/status`, `/`.
//! - [`status_page`]: the human status page rendered from the status document.

pub mod config;
pub mod metrics;
pub mod probe;
pub mod server;
pub mod status_page;
