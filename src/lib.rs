//! lockprobe: synthetic probes and convergence monitoring for routing-embedded
//! migration locks.
//!
//! Layers, bottom up; each uses only the layers above it in this list, and
//! `tests/layering.rs` checks it (the picture is in `docs/architecture.md`):
//!
//! 1. The bottom, importing nothing of ours but [`versions`]:
//!    - [`versions`]: what this build speaks and stores, named once: the crate's
//!      version, the contract version and the document formats it reads and writes.
//!    - [`clock`]: the one source of time: the system clock, a manual clock, a clock
//!      that follows tokio's (pausable) time, and a skewed clock for fault tests.
//!    - [`duration`]: the ten-year bound on every duration and the human form they are
//!      read in, for flags and files alike.
//!    - [`document`]: the location document (what the store keeps and the lock lives
//!      in), its formats (`schemaVersion`) and the lock token.
//!    - [`percentiles`]: exact percentiles over a sliding window, for status documents.
//!    - [`exposition`]: the Prometheus text format, the one `GET /metrics` route, the
//!      histogram buckets the probe and the monitor share, and the build and process
//!      metrics every process exports.
//!    - [`html`]: what the probe's status page and the monitor's page share: escaping,
//!      durations for people, the light and dark palette (contrast-checked), the page
//!      frame with its refresh, sparklines.
//!    - [`listener`]: the one accept path of every HTTP server the package runs, with
//!      its bounds (connections, the time to send a request head, body size), TLS from
//!      files, and `--web.config.file` (TLS, client certificates, bcrypt basic
//!      authentication; re-read on change).
//! 2. [`store`]: the `LocationStore` trait; [`store::memory`] is the embedded default,
//!    [`store::cosmos`] the Azure Cosmos DB backend (which discovers the account's write
//!    region and follows a failover); inside the crate, `store::faults` a wrapper around
//!    either and the only fault injector (slow, late, ambiguous, failed and lost-race
//!    calls), `store::counting` the only counter (point calls by document kind, routing
//!    document or lock record, and every call by kind), and `store::latency` one that
//!    gives the memory store Cosmos DB's latencies for load runs (the tests reach these
//!    three through `testing`, below). It knows documents, not lock rules, and no
//!    command line.
//! 3. [`routing`]: the lock lifecycle (pure, with the commit-time rules and idempotency
//!    records), the two-person force-release of a stuck lock (pure too), enforcement,
//!    cache freshness, the tiered cache and the `RoutingClient` a service links.
//! 4. Three components, none using another or the wiring:
//!    - [`service`]: the reference service speaking the probe contract
//!      (`docs/contract.md`) over the routing library, with its operators' admin routes
//!      (force-release, by two admin principals), the contract's OpenAPI 3.1
//!      description at `GET /openapi.json`, over HTTP or HTTPS (optionally mutual TLS);
//!      its locks embedded in the routing document or, as a measured baseline, in
//!      separate lock records ([`service::LockDesign`]).
//!    - [`monitor`]: the convergence monitor; reads the store's change stream and settles
//!      what it reads with the routing lifecycle's rules.
//!    - [`probe`]: the black-box probe, in three rooms: `probe::checks` (the contract
//!      client, one cycle's walk, negative, force-release and eager checks judged over
//!      their decision windows, the report, credentials and the journal of held locks),
//!      `probe::outputs` (metrics, the status document and page, JUnit) and
//!      `probe::engine` (`serve`'s configuration and its reload, the runtime and its
//!      scheduler, the HTTP server, one-shot runs and the release gate's runs). It
//!      speaks HTTP to the service it judges and uses only [`clock`], [`duration`],
//!      [`percentiles`], [`exposition`], [`html`] and [`listener`].
//! 5. [`harness`]: the runs that measure the package at scale, for `BENCHMARKS.md`
//!    (`lockprobe bench`'s head-to-head load, a paper-scale day of migrations replayed
//!    on a manual clock, a thousand probe targets in one process) and the one way they
//!    read CPU time and memory; `examples/` and `app` drive them.
//! 6. [`app`]: the wiring, one module per command (`serve`, `demo`, `validate`, `gate`,
//!    `service`, `monitor`, `bench`, `admin`), the store selection they share, usage errors and
//!    their shutdown; `main.rs` only parses the command line and calls into it.
//!
//! What is public: the bottom modules, [`store`] (but for its three wrappers above) and
//! [`routing`] with their module paths (services embed them, and
//! `scripts/compat-corpus/` compiles against those paths), and
//! for each component a short `pub use` list at its root ([`service`], [`monitor`] with
//! its [`monitor::http`] routes, [`probe`], [`harness`] with its three runs); the
//! components' parts are private. [`app`] keeps one public module per command, for
//! `main.rs`. `testing`, hidden from the documentation, exposes once what the fault,
//! campaign, store and load tests need from inside; it carries no stability promise.

#![warn(missing_docs)]

pub mod app;
pub mod clock;
pub mod document;
pub mod duration;
pub mod exposition;
pub mod harness;
pub mod html;
pub mod listener;
pub mod monitor;
pub mod percentiles;
pub mod probe;
pub mod routing;
pub mod service;
pub mod store;
pub mod versions;

#[doc(hidden)]
pub mod testing {
    //! What the fault, campaign, store and load tests need from inside the crate, exposed
    //! once and on purpose: the store's fault injector, its call counter and its latency
    //! wrapper. They are the reference service's, the release gate's and the benchmarks'
    //! tools, not part of the library a service embeds, so they are hidden from the
    //! documentation and carry no stability promise: any release may change them.
    //!
    //! `tests/layering.rs` names the test files that may use this module; no module of
    //! the crate uses it (they use the items by their own paths).

    pub use crate::store::counting::{CountingStore, OpCounts};
    pub use crate::store::faults::{in_step, FaultAction, FaultKind, FaultRule, FaultStats, FaultyStore, OpSet};
    pub use crate::store::latency::{LatencyModel, LatencyStore};
}
