//! The monitor's flags (flattened into `lockprobe monitor`, and into `serve` when it
//! runs a monitor): every interval in human form (`200ms`, `5m`, `48h`).

use std::time::Duration;

use super::config::{MonitorConfig, MonitorConfigError};

/// A flag whose value the monitor cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct ArgsError {
    /// The flag at fault, e.g. `--scan-interval`.
    pub flag: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The monitor's settings as flags. Every flag carries a `--monitor-` prefix (and an
/// `LOCKPROBE_MONITOR_*` variable) so the struct can be flattened into any command,
/// `serve` included, beside other parts' flags.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorArgs {
    /// Wait after an empty change-stream poll.
    #[arg(id = "monitor_poll_interval", long = "monitor-poll-interval", env = "LOCKPROBE_MONITOR_POLL_INTERVAL", default_value = "200ms", value_parser = crate::usage::parse_bounded_duration)]
    pub poll_interval: Duration,
    /// Changes asked for per poll.
    #[arg(id = "monitor_poll_batch", long = "monitor-poll-batch", env = "LOCKPROBE_MONITOR_POLL_BATCH", default_value_t = 1000)]
    pub poll_batch: usize,
    /// How often the whole store is scanned for orphans and partial cutovers.
    #[arg(id = "monitor_scan_interval", long = "monitor-scan-interval", env = "LOCKPROBE_MONITOR_SCAN_INTERVAL", default_value = "5m", value_parser = crate::usage::parse_bounded_duration)]
    pub scan_interval: Duration,
    /// Documents per scan page.
    #[arg(id = "monitor_scan_page", long = "monitor-scan-page", env = "LOCKPROBE_MONITOR_SCAN_PAGE", default_value_t = 1000)]
    pub scan_page: usize,
    /// How often lapsed leases are looked for between scans.
    #[arg(id = "monitor_sweep_interval", long = "monitor-sweep-interval", env = "LOCKPROBE_MONITOR_SWEEP_INTERVAL", default_value = "5s", value_parser = crate::usage::parse_bounded_duration)]
    pub sweep_interval: Duration,
    /// How long past a lease's end the sweep waits before calling it lapsed (covers
    /// change-stream delivery lag).
    #[arg(id = "monitor_lapse_grace", long = "monitor-lapse-grace", env = "LOCKPROBE_MONITOR_LAPSE_GRACE", default_value = "30s", value_parser = crate::usage::parse_bounded_duration)]
    pub lapse_grace: Duration,
    /// The orchestrator's buffer after the convergence delay before hardDelete.
    #[arg(id = "monitor_escalation_buffer", long = "monitor-escalation-buffer", env = "LOCKPROBE_MONITOR_ESCALATION_BUFFER", default_value = "10m", value_parser = crate::usage::parse_bounded_duration)]
    pub escalation_buffer: Duration,
    /// The service's declared convergence delay (max cache TTL + replication bound); a
    /// lock declaring less is judged against this.
    #[arg(id = "monitor_declared_delay", long = "monitor-declared-delay", env = "LOCKPROBE_MONITOR_DECLARED_DELAY", value_parser = crate::usage::parse_bounded_duration)]
    pub declared_delay: Option<Duration>,
}

impl MonitorArgs {
    /// The validated configuration; an error names the flag.
    pub fn to_config(&self) -> Result<MonitorConfig, ArgsError> {
        let config = MonitorConfig {
            poll_interval: self.poll_interval,
            poll_batch: self.poll_batch,
            scan_interval: self.scan_interval,
            scan_page: self.scan_page,
            sweep_interval: self.sweep_interval,
            lapse_grace: self.lapse_grace,
            escalation_buffer: self.escalation_buffer,
            declared_delay: self.declared_delay,
            ..MonitorConfig::default()
        };
        config.validate().map_err(|e| {
            let field = match &e {
                MonitorConfigError::NotPositive { field }
                | MonitorConfigError::ZeroCount { field } => *field,
            };
            let reason = match &e {
                MonitorConfigError::NotPositive { .. } => "must be positive".to_owned(),
                MonitorConfigError::ZeroCount { .. } => "must be at least 1".to_owned(),
            };
            ArgsError {
                flag: format!("--monitor-{}", field.replace('_', "-")),
                reason,
            }
        })?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        monitor: MonitorArgs,
    }

    #[test]
    fn human_durations_parse_and_defaults_validate() {
        let cli = Cli::try_parse_from([
            "lockprobe",
            "--monitor-scan-interval",
            "2s",
            "--monitor-escalation-buffer",
            "1s",
            "--monitor-declared-delay",
            "4s",
        ])
        .unwrap();
        let config = cli.monitor.to_config().unwrap();
        assert_eq!(config.scan_interval, Duration::from_secs(2));
        assert_eq!(config.declared_delay, Some(Duration::from_secs(4)));
        assert_eq!(config.poll_interval, Duration::from_millis(200));
    }

    #[test]
    fn a_zero_interval_names_its_flag() {
        let cli = Cli::try_parse_from(["lockprobe", "--monitor-sweep-interval", "0s"]).unwrap();
        let err = cli.monitor.to_config().unwrap_err();
        assert_eq!(err.flag, "--monitor-sweep-interval");
        assert_eq!(err.to_string(), "--monitor-sweep-interval: must be positive");
        assert!(Cli::try_parse_from(["lockprobe", "--monitor-poll-interval", "soon"]).is_err());
    }

    #[test]
    fn an_interval_over_ten_years_names_its_flag() {
        let err = Cli::try_parse_from(["lockprobe", "--monitor-lapse-grace", "500000years"]).unwrap_err().to_string();
        assert!(err.contains("--monitor-lapse-grace") && err.contains("over the limit of 10years"), "{err}");
        assert!(Cli::try_parse_from(["lockprobe", "--monitor-lapse-grace", "10years"]).is_ok());
    }
}
