//! lockprobe: synthetic probes and convergence monitoring for routing-embedded
//! migration locks.
//!
//! Layers, bottom up (each imports only what is listed before it):
//!
//! - [`clock`]: the one source of time: the system clock, a manual clock, a clock that
//!   follows tokio's (pausable) time, and a skewed clock for fault tests.
//! - [`routing::document`]: the location document and its schema versioning.
//! - [`store`]: the `LocationStore` trait; [`store::memory`] is the embedded default,
//!   [`store::cosmos`] the Azure Cosmos DB backend, [`store::faults`] a wrapper around
//!   either that injects slow, late, ambiguous and failed calls.
//! - [`routing`]: the lock lifecycle (pure, with the commit-time rules and idempotency
//!   records), enforcement, cache freshness, the tiered cache and the `RoutingClient` a
//!   service links.
//! - [`service`]: the reference service speaking the probe contract over the routing library.
//! - [`usage`]: command-line usage errors (exit 64).
//! - [`exposition`]: the Prometheus text format and the one `GET /metrics` route.
//! - [`percentiles`]: exact percentiles over a sliding window, for the status documents.
//!
//! Beside them, judging them from outside:
//!
//! - [`probe`]: the black-box probe (contract client, cycles, scheduler, reports, its
//!   `serve` configuration, metrics, HTTP server and status page). It speaks HTTP to the
//!   service it judges and imports none of the layers above but [`usage`].
//! - [`monitor`]: the convergence monitor; reads the store's change stream, never the probe.
//!
//! Wiring, above everything else:
//!
//! - [`app`]: one module per command (`serve`, `demo`, `validate`, `service`, `monitor`)
//!   and the store selection they share; `main.rs` only parses the command line and
//!   calls into it.

pub mod app;
pub mod clock;
pub mod exposition;
pub mod monitor;
pub mod percentiles;
pub mod probe;
pub mod routing;
pub mod service;
pub mod store;
pub mod usage;
