//! What the probe's cycles become for the people and systems that watch them; uses the
//! [`super::checks`] room, never the engine.
//!
//! - [`metrics`]: the Prometheus metrics, with exact percentiles beside them.
//! - [`status`] and [`status_page`]: the status document (`/api/v1/status`) and its page.
//! - [`junit`] and [`gate_junit`]: a cycle's JUnit report and the release gate's.

pub(crate) mod gate_junit;
pub(crate) mod junit;
pub(crate) mod metrics;
pub(crate) mod status;
pub(crate) mod status_page;
