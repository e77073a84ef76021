//! The probe: a black-box client that plays a migration orchestrator against any service
//! speaking the probe contract (`docs/architecture.md`) and asserts that every lock phase is
//! enforced on the real routing path. It never imports the routing library, the service or
//! the store: a probe that shares code paths with what it judges can share its bugs.

pub mod config;
pub mod credentials;
pub mod gate_junit;
pub mod metrics;
pub mod observer;
pub mod reload;
pub mod report;
pub mod runtime;
pub mod scenario;
pub mod scheduler;
pub mod server;
pub mod settings;
pub mod state;
pub mod status;
pub mod status_page;
pub mod target;
mod tls_refusal;
pub mod validate;
pub mod vocabulary;
