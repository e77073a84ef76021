//! What one probe cycle checks, and with what: the bottom room of the probe.
//!
//! - [`scenario`]: one cycle: the main migration walk, the negative checks, the
//!   force-release check (with two admin keys) and the eager checks, each on its own
//!   test resource, every held operation judged over its decision window.
//! - [`target`]: the contract client for a target's instances (and, in
//!   `tls_refusal`, why an `https` instance refused a connection).
//! - [`vocabulary`] and [`report`]: phases, operations and outcomes; assertions and
//!   the cycle report.
//! - [`settings`] and [`credentials`]: what a cycle needs to know about its target.
//! - [`state`]: the journal of locks held, so a restarted probe releases what a killed
//!   one left.
//! - [`observer`]: the progress a running cycle reports.

pub(crate) mod credentials;
pub(crate) mod observer;
pub(crate) mod report;
pub(crate) mod scenario;
pub(crate) mod settings;
pub(crate) mod state;
pub(crate) mod target;
mod tls_refusal;
pub(crate) mod vocabulary;
