//! The probe: a black-box client that plays a migration orchestrator against any service
//! speaking the probe contract (`docs/contract.md`) and asserts that every lock phase is
//! enforced on the real routing path. It never imports the routing library, the service or
//! the store: a probe that shares code paths with what it judges can share its bugs.
//!
//! Three rooms, each using only the ones before it (`tests/layering.rs` checks it):
//!
//! - `checks`: what one cycle checks and with what: the contract client, the cycle's
//!   walk, negative and eager checks judged over their decision windows, the vocabulary
//!   and report of assertions, the per-target settings, credentials and the journal of
//!   held locks, and the [`Observer`] a cycle reports progress to.
//! - `outputs`: what the cycles' results become: Prometheus metrics, the status
//!   document and page, the JUnit reports, and the observers that print or log.
//! - `engine`: what runs cycles: `serve`'s configuration, the runtime and its
//!   scheduler, the HTTP server, reloads, and the one-shot runs (`validate`).

// The rooms and their parts are the crate's own (the wiring reaches into them); what a
// probe user and the tests need is re-exported here, one list, so the rooms' layout is
// not part of the API.
pub(crate) mod checks;
pub(crate) mod engine;
pub(crate) mod outputs;

pub use checks::credentials::{TargetTls, TlsFiles};
pub use checks::observer::{Observer, PrintObserver, TracingObserver};
pub use checks::report::{Assertion, CycleReport, CycleResult};
pub use checks::scenario::Scenario;
pub use checks::settings::{AdminKeys, Leases, ProbeSettings, DEFAULT_MAX_INCONCLUSIVE, RESOURCES_PER_CYCLE};
pub use checks::state::StateFile;
pub use checks::target::{CallKey, TargetClient, TargetError};
pub use checks::vocabulary::{Op, Outcome, Phase};
pub use engine::runtime::{target_control, Probe, RunSummary, TargetChanges, DEFAULT_MAX_CONCURRENT_CYCLES};
pub use engine::scheduler::TargetSchedule;
pub use engine::server::{router, AppState};
pub use engine::validate::{run as validate, ValidateOptions};
pub use outputs::metrics::Metrics;
pub use outputs::status::{CycleDocument, ProbeStatus, StatusDocument};
pub use outputs::status_page::render as render_status_page;
