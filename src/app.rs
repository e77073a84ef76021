//! The wiring: one module per `lockprobe` command, each turning its flags (or its
//! configuration file) into the parts of the library and running them. Nothing below
//! imports this module; `main.rs` only parses the command line and calls into it.
//!
//! - [`serve`]: `lockprobe serve` and `check-config`: the probe on its schedules and,
//!   with a `[monitor]` table, the convergence monitor, in one process.
//! - [`mod@bench`]: `lockprobe bench`: the embedded and lock-record designs head to head
//!   under one load, store reads per operation counted by the store.
//! - [`demo`]: `lockprobe demo`: store, reference service, probe and monitor in one process.
//! - [`validate`]: `lockprobe validate`: one probe cycle as a pre-release gate.
//! - [`gate`]: `lockprobe gate`: the release gate, a candidate service under every
//!   store-fault profile, probed with the eager checks.
//! - [`service`]: `lockprobe service`: the reference service.
//! - [`admin`]: `lockprobe admin force-release request|approve|list`: an operator's
//!   client of the service's admin routes.
//! - [`monitor`]: `lockprobe monitor`: the convergence monitor alone.
//! - [`store`]: `--store memory|cosmos` and the `--cosmos-*` flags, and opening the store
//!   they name.
//! - [`listen`]: `--header-read-timeout` and `--max-connections`, the listener bounds
//!   of every command that listens.
//! - [`usage`]: usage errors (exit 64).
//! - `tasks`: how `serve` and `demo` run their background parts and stop them.

pub mod admin;
pub mod bench;
pub mod demo;
pub mod gate;
pub mod listen;
pub mod monitor;
pub mod serve;
pub mod service;
pub mod store;
mod tasks;
pub mod usage;
pub mod validate;
