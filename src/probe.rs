//! The probe: a black-box client that plays a migration orchestrator against any service
//! speaking the probe contract (`docs/contract.md`) and asserts that every lock phase is
//! enforced on the real routing path. It never imports the routing library, the service or
//! the store: a probe that shares code paths with what it judges can share its bugs.
//!
//! Three rooms, each using only the ones before it (`tests/layering.rs` checks it):
//!
//! - [`checks`]: what one cycle checks and with what: the contract client, the cycle's
//!   walk, negative and eager checks judged over their decision windows, the vocabulary
//!   and report of assertions, the per-target settings, credentials and the journal of
//!   held locks, and the [`checks::observer::Observer`] a cycle reports progress to.
//! - [`outputs`]: what the cycles' results become: Prometheus metrics, the status
//!   document and page, the JUnit reports, and the observers that print or log.
//! - [`engine`]: what runs cycles: `serve`'s configuration, the runtime and its
//!   scheduler, the HTTP server, reloads, and the one-shot runs (`validate`).

pub mod checks;
pub mod engine;
pub mod outputs;
