//! Reloading the configuration of a running probe: what a reload reports, why one is
//! refused (each refusal a problem+json `type` of `POST /-/reload`), and the two gauges
//! Prometheus itself exports for its own reloads.
//!
//! Reading the file and working out what changed is the wiring's (`serve` knows the
//! file and the parts beside the probe); applying it is [`super::runtime::TargetControl`].

use std::fmt::Debug;

use async_trait::async_trait;
use axum::http::StatusCode;
use prometheus::{Gauge, Opts, Registry};
use serde::Serialize;

use super::config::ConfigError;
use crate::probe::outputs::metrics::MetricsError;

/// Prefix of every problem `type` (the contract's, so one table covers them).
pub const TYPE_PREFIX: &str = "urn:lockprobe:error:";

/// Re-reads the configuration and applies it.
#[async_trait]
pub trait Reload: Debug + Send + Sync + 'static {
    /// Applies the configuration as it is now, or refuses it and changes nothing.
    async fn reload(&self) -> Result<ReloadReport, ReloadError>;
}

/// Which targets a reload added, changed, removed and left alone (by name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// Started now.
    pub added: Vec<String>,
    /// New settings from their next cycle.
    pub changed: Vec<String>,
    /// No new cycles; the one in flight finishes.
    pub removed: Vec<String>,
    /// Untouched: same schedule, cycles in flight go on.
    pub unchanged: Vec<String>,
}

/// Why a reload was refused; the configuration in force stays as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read.
    #[error("{0}")]
    Unreadable(String),
    /// The file is not TOML of the configuration's shape (syntax, an unknown or missing
    /// field, a wrong type); the message names the field where the parser could.
    #[error("{0}")]
    Malformed(String),
    /// A field parsed but its value cannot be used (an unset key variable included).
    #[error("{field}: {message}")]
    Invalid {
        /// Dotted path of the field, e.g. `targets[0].schedule`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A field that only a restart applies has changed.
    #[error("{field}: changed, and a change of {field} requires a restart (the running configuration is kept)")]
    RequiresRestart {
        /// The field, e.g. `state_file`.
        field: String,
    },
    /// The process is shutting down.
    #[error("the probe is shutting down; the configuration is not reloaded")]
    ShuttingDown,
}

impl From<ConfigError> for ReloadError {
    fn from(e: ConfigError) -> Self {
        match e {
            ConfigError::Read { .. } => Self::Unreadable(e.to_string()),
            ConfigError::Parse(message) => Self::Malformed(message),
            ConfigError::Invalid { field, message } => Self::Invalid { field, message },
        }
    }
}

impl ReloadError {
    /// The stable problem `type`, after [`TYPE_PREFIX`].
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unreadable(_) => "config-unreadable",
            Self::Malformed(_) => "config-malformed",
            Self::Invalid { .. } => "config-invalid",
            Self::RequiresRestart { .. } => "config-requires-restart",
            Self::ShuttingDown => "shutting-down",
        }
    }

    /// The HTTP status of `POST /-/reload`: 400 for a file that does not parse, 422 for
    /// one that parses but cannot be applied, 503 while shutting down.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::Unreadable(_) | Self::Invalid { .. } | Self::RequiresRestart { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The field the refusal is about, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } | Self::RequiresRestart { field } => Some(field),
            _ => None,
        }
    }
}

/// `lockprobe_config_last_reload_successful` and
/// `lockprobe_config_last_reload_success_timestamp_seconds`, named and meant as
/// Prometheus's own `prometheus_config_*` pair: the start's load counts as a reload.
#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    successful: Gauge,
    success_timestamp: Gauge,
}

impl ReloadMetrics {
    /// Registers both gauges on `registry`, as after a successful load now.
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        let successful = Gauge::with_opts(Opts::new(
            "lockprobe_config_last_reload_successful",
            "1 when the last configuration reload (SIGHUP or POST /-/reload) was applied, 0 when it was refused.",
        ))?;
        let success_timestamp = Gauge::with_opts(Opts::new(
            "lockprobe_config_last_reload_success_timestamp_seconds",
            "Unix time of the last configuration load or reload that was applied.",
        ))?;
        registry.register(Box::new(successful.clone()))?;
        registry.register(Box::new(success_timestamp.clone()))?;
        let metrics = Self { successful, success_timestamp };
        metrics.record(true);
        Ok(metrics)
    }

    /// Records a reload that was applied (`true`) or refused.
    pub fn record(&self, applied: bool) {
        self.successful.set(if applied { 1.0 } else { 0.0 });
        if applied {
            self.success_timestamp.set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_have_stable_types_statuses_and_fields() {
        let invalid: ReloadError =
            ConfigError::Invalid { field: "targets[1].schedule".into(), message: "bad".into() }.into();
        assert_eq!(
            (invalid.kind(), invalid.status(), invalid.field()),
            ("config-invalid", StatusCode::UNPROCESSABLE_ENTITY, Some("targets[1].schedule"))
        );
        let malformed: ReloadError = ConfigError::Parse("unknown field `x`".into()).into();
        assert_eq!((malformed.kind(), malformed.status()), ("config-malformed", StatusCode::BAD_REQUEST));
        let restart = ReloadError::RequiresRestart { field: "state_file".into() };
        assert_eq!(restart.kind(), "config-requires-restart");
        assert!(restart.to_string().starts_with("state_file: ") && restart.to_string().contains("requires a restart"));
        assert_eq!(ReloadError::ShuttingDown.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn gauges_start_as_a_successful_load_and_follow_reloads() {
        let registry = Registry::new();
        let m = ReloadMetrics::new(&registry).unwrap();
        let text = || crate::exposition::render(&registry);
        assert!(text().contains("lockprobe_config_last_reload_successful 1\n"), "{}", text());
        let first = m.success_timestamp.get();
        assert!(first > 1.7e9, "{first}");
        m.record(false);
        assert!(text().contains("lockprobe_config_last_reload_successful 0\n"), "{}", text());
        assert_eq!(m.success_timestamp.get(), first, "a refusal keeps the last success's time");
        m.record(true);
        assert!(text().contains("lockprobe_config_last_reload_successful 1\n"));
    }
}
