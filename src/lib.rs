//! lockprobe: synthetic probes and convergence monitoring for routing-embedded
//! migration locks.
//!
//! Layers, bottom up; each uses only the layers above it in this list, and
//! `tests/layering.rs` checks it (the picture is in `docs/architecture.md`):
//!
//! 1. The bottom, importing nothing of ours:
//!    - [`clock`]: the one source of time: the system clock, a manual clock, a clock
//!      that follows tokio's (pausable) time, and a skewed clock for fault tests.
//!    - [`duration`]: the ten-year bound on every duration and the human form they are
//!      read in, for flags and files alike.
//!    - [`document`]: the location document (what the store keeps and the lock lives
//!      in), its schema versioning and the lock token.
//!    - [`percentiles`]: exact percentiles over a sliding window, for status documents.
//!    - [`exposition`]: the Prometheus text format, the one `GET /metrics` route, the
//!      histogram buckets the probe and the monitor share, and the build and process
//!      metrics every process exports.
//!    - [`html`]: what the probe's status page and the monitor's page share: escaping,
//!      durations for people, the light and dark palette (contrast-checked), the page
//!      frame with its refresh, sparklines.
//! 2. [`store`]: the `LocationStore` trait; [`store::memory`] is the embedded default,
//!    [`store::cosmos`] the Azure Cosmos DB backend (which discovers the account's write
//!    region and follows a failover), [`store::faults`] a wrapper around
//!    either that injects slow, late, ambiguous and failed calls, [`store::counting`] a
//!    wrapper counting point calls by document kind (routing document or lock record),
//!    and [`store::latency`] one that gives the memory store Cosmos DB's latencies for
//!    load runs. It knows documents, not lock rules, and no command line.
//! 3. [`routing`]: the lock lifecycle (pure, with the commit-time rules and idempotency
//!    records), enforcement, cache freshness, the tiered cache and the `RoutingClient` a
//!    service links.
//! 4. Three components, none using another or the wiring:
//!    - [`service`]: the reference service speaking the probe contract
//!      (`docs/contract.md`) over the routing library, with the contract's OpenAPI 3.1
//!      description at `GET /openapi.json`, over HTTP or HTTPS (optionally mutual TLS);
//!      its locks embedded in the routing document or, as a measured baseline, in
//!      separate lock records ([`service::design`]).
//!    - [`monitor`]: the convergence monitor; reads the store's change stream and settles
//!      what it reads with the routing lifecycle's rules.
//!    - [`probe`]: the black-box probe (contract client, cycles with eager checks,
//!      scheduler, reports and the release gate's JUnit, its
//!      `serve` configuration, its reload and credentials (key files, CA files, client
//!      certificates), metrics, HTTP server and status page). It speaks HTTP to
//!      the service it judges and uses only [`clock`], [`duration`], [`percentiles`],
//!      [`exposition`] and [`html`].
//! 5. [`app`]: the wiring, one module per command (`serve`, `demo`, `validate`, `gate`,
//!    `service`, `monitor`, `bench`), the store selection they share and their shutdown,
//!    and the two scale runs behind `examples/` (`replay`: a paper-scale day of
//!    migrations; `probe_scale`: a thousand probe targets in one process); `main.rs` only
//!    parses the command line and calls into it.

pub mod app;
pub mod clock;
pub mod document;
pub mod duration;
pub mod exposition;
pub mod harness;
pub mod html;
pub mod monitor;
pub mod percentiles;
pub mod probe;
pub mod routing;
pub mod service;
pub mod store;
