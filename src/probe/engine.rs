//! What runs the probe's cycles; uses the [`super::checks`] and [`super::outputs`] rooms.
//!
//! - [`config`]: `serve`'s configuration file, checked as a whole.
//! - [`runtime`] and [`scheduler`]: every target on its schedule, with a cap on the
//!   cycles running at once, claims on test resources against other replicas, and
//!   recovery at start.
//! - [`server`]: the probe's own HTTP surface (`/metrics`, health, status, reload).
//! - [`reload`] and [`reloader`]: what a reload is and how it answers, and the reload
//!   of `serve`'s configuration file.
//! - [`validate`]: one cycle against given instances, as `validate` and the release gate
//!   run it; [`gate`]: the release gate's runs of a candidate under every profile;
//!   [`rollout`]: its rollout profiles, a baseline and a candidate build side by side.

pub(crate) mod config;
pub(crate) mod gate;
pub(crate) mod reload;
pub(crate) mod reloader;
pub(crate) mod rollout;
pub(crate) mod runtime;
pub(crate) mod scheduler;
pub(crate) mod server;
pub(crate) mod validate;
