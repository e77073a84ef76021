//! What the monitor is told: intervals, the escalation buffer and the service's
//! declared convergence delay. Every duration is configuration.

use std::time::Duration;

/// A monitor setting that cannot be used, naming the field (or flag) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MonitorConfigError {
    /// A duration that must be positive is zero.
    #[error("{field} must be positive")]
    NotPositive {
        /// The field or flag name.
        field: &'static str,
    },
    /// A count that must be positive is zero.
    #[error("{field} must be at least 1")]
    ZeroCount {
        /// The field or flag name.
        field: &'static str,
    },
}

/// Settings of one monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorConfig {
    /// How long the change-stream loop waits after an empty poll.
    pub poll_interval: Duration,
    /// How many changes one poll asks for.
    pub poll_batch: usize,
    /// How often the whole store is scanned for orphaned locks and partial cutovers the
    /// stream may have missed.
    pub scan_interval: Duration,
    /// Page size of the scan.
    pub scan_page: usize,
    /// How often in-memory timelines are checked for leases that ran out with no event.
    pub sweep_interval: Duration,
    /// How long past a lease's end a lock still in the document is taken as live
    /// before it is called lapsed (by the sweep, the stream or a scan alike): a swap
    /// committed just before expiry may be delivered late by the stream, and a service
    /// whose clock lags the monitor's may still swap under the lease.
    pub lapse_grace: Duration,
    /// The orchestrator's safety buffer: hardDelete must not come before
    /// acquiredAt + declared delay + buffer.
    pub escalation_buffer: Duration,
    /// The convergence delay the service declared (max cache TTL + replication bound),
    /// if the monitor is told one. A lock whose own declared delay
    /// (effectiveAt - acquiredAt) is shorter is judged against this one instead: a
    /// client that under-declares cannot hide an early escalation.
    pub declared_delay: Option<Duration>,
    /// How many recent anomalies the status API lists.
    pub recent_anomalies: usize,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(200),
            poll_batch: 1000,
            scan_interval: Duration::from_secs(300),
            scan_page: 1000,
            sweep_interval: Duration::from_secs(5),
            lapse_grace: Duration::from_secs(30),
            escalation_buffer: Duration::from_secs(600),
            declared_delay: None,
            recent_anomalies: 32,
        }
    }
}

impl MonitorConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), MonitorConfigError> {
        for (field, d) in [
            ("poll_interval", self.poll_interval),
            ("scan_interval", self.scan_interval),
            ("sweep_interval", self.sweep_interval),
        ] {
            if d.is_zero() {
                return Err(MonitorConfigError::NotPositive { field });
            }
        }
        for (field, n) in [
            ("poll_batch", self.poll_batch),
            ("scan_page", self.scan_page),
        ] {
            if n == 0 {
                return Err(MonitorConfigError::ZeroCount { field });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zero_intervals_are_named() {
        MonitorConfig::default().validate().unwrap();
        let bad = MonitorConfig {
            scan_interval: Duration::ZERO,
            ..MonitorConfig::default()
        };
        assert_eq!(
            bad.validate(),
            Err(MonitorConfigError::NotPositive {
                field: "scan_interval"
            })
        );
        let bad = MonitorConfig {
            poll_batch: 0,
            ..MonitorConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "poll_batch must be at least 1"
        );
    }
}
