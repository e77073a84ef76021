//! Runs that measure the package at scale, for `BENCHMARKS.md` and the suite's smoke
//! runs of them; none is a command of its own (`lockprobe bench` and `examples/` drive
//! them). They use every layer below the wiring and nothing of it.
//!
//! - [`load`]: one head-to-head load run of a lock design through the service's real
//!   handlers over one store (`lockprobe bench`).
//! - [`probe_scale`]: a thousand probe targets in one process against in-process
//!   services (`examples/probe_scale.rs`).
//! - [`replay`]: a paper-scale day of migrations on a manual clock, the monitor
//!   following it (`examples/replay.rs`).
//! - `measure`: the CPU time and memory every run reports, read one way.
//! - `sizes`: the size of the documents a run writes, by lock phase (the load and the
//!   replay report it).

// Each run is a module of its own (its `run`, its configuration and its result); how
// they measure is the harness's own, with the figures callers compare against
// re-exported.
pub mod load;
pub(crate) mod measure;
pub mod probe_scale;
pub mod replay;
pub(crate) mod sizes;

pub use measure::peak_rss_bytes;
pub use sizes::{MAX_BYTES, P99_BUDGET_BYTES};
