//! lockprobe: synthetic probes and convergence monitoring for routing-embedded
//! migration locks.
//!
//! Layers, bottom up (each only imports the ones above it):
//!
//! - [`clock`]: the one source of time; a system clock and a manual clock.
//! - [`routing::document`]: the location document and its schema versioning.
//! - [`routing`]: the lock lifecycle (pure), enforcement, the tiered cache and the
//!   `RoutingClient` a service links.
//! - [`store`]: the `LocationStore` trait; [`store::memory`] is the embedded default.
//! - [`service`]: the reference service speaking the probe contract over the routing library.
//! - [`usage`]: command-line usage errors (exit 64).
//! - [`probe`]: the black-box probe (contract client, cycles, scheduler, reports); HTTP only.
//! - [`config`]: the TOML configuration of `serve`, validated with errors naming the field.
//! - [`metrics`]: the probe's Prometheus registry and exact HDR percentiles.
//! - [`server`]: the probe's HTTP server: `/metrics`, `/healthz`, `/readyz`, `/api/v1/status`, `/`.
//! - [`demo`]: `lockprobe demo`: store, reference service and probe wired in one process.
//! - [`status_page`]: the human status page at `/`, rendered from the status API's JSON.
//! - [`monitor`]: the convergence monitor over the store's change stream.
//! - [`serve`]: `lockprobe serve`: the probe and, when configured, the monitor in one process.

pub mod clock;
pub mod config;
pub mod demo;
pub mod metrics;
pub mod monitor;
pub mod probe;
pub mod routing;
pub mod serve;
pub mod server;
pub mod service;
pub mod status_page;
pub mod store;
pub mod usage;
