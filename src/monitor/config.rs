//! What the monitor is told: intervals, the escalation buffer and the service's
//! declared convergence delay. Every duration is configuration.
//!
//! [`MonitorConfig`] is the one settings type of the monitor, written once as clap
//! flags: each with a `--monitor-` prefix and a `LOCKPROBE_MONITOR_*` variable, so it can
//! be flattened into any command beside other parts' flags. A `[monitor]` table of a
//! `serve` configuration (the flag's name without its dashes, `_` for `-`:
//! `monitor_escalation_buffer = "10m"`) is read through these same flags by the wiring,
//! so a key has no name, parser or default of its own to drift from its flag's.

use std::time::Duration;

/// A monitor setting that cannot be used, naming the field at fault (see
/// [`MonitorConfigError::flag`] and [`MonitorConfigError::key`] for its other names).
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
    /// A count larger than the monitor will ask the store for at once.
    #[error("{field} must be at most {max}")]
    TooLarge {
        /// The field or flag name.
        field: &'static str,
        /// The largest value taken.
        max: usize,
    },
}

/// Settings of one monitor: flags, `[monitor]` keys and the struct are one type.
/// Missing keys and absent flags take the defaults of [`MonitorConfig::default`].
///
/// Each flag names itself twice, as `long` and `env`; clap needs both spelled out because
/// it has no prefix for a flattened group. The one explicit `id` is for the field whose
/// name the Cosmos store's flags (flattened beside these) also use.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct MonitorConfig {
    /// Wait after an empty change-stream poll.
    #[arg(id = "monitor_poll_interval", long = "monitor-poll-interval", env = "LOCKPROBE_MONITOR_POLL_INTERVAL", default_value = "200ms", value_parser = crate::duration::parse_bounded_duration)]
    pub poll_interval: Duration,
    /// Changes asked for per poll.
    #[arg(long = "monitor-poll-batch", env = "LOCKPROBE_MONITOR_POLL_BATCH", default_value_t = 1000)]
    pub poll_batch: usize,
    /// How often the whole store is scanned for orphans and partial cutovers the stream
    /// may have missed.
    #[arg(long = "monitor-scan-interval", env = "LOCKPROBE_MONITOR_SCAN_INTERVAL", default_value = "5m", value_parser = crate::duration::parse_bounded_duration)]
    pub scan_interval: Duration,
    /// Documents per scan page.
    #[arg(long = "monitor-scan-page", env = "LOCKPROBE_MONITOR_SCAN_PAGE", default_value_t = 1000)]
    pub scan_page: usize,
    /// How often lapsed leases are looked for between scans.
    #[arg(long = "monitor-sweep-interval", env = "LOCKPROBE_MONITOR_SWEEP_INTERVAL", default_value = "5s", value_parser = crate::duration::parse_bounded_duration)]
    pub sweep_interval: Duration,
    /// How long past a lease's end the sweep waits before calling it lapsed (covers
    /// change-stream delivery lag).
    ///
    /// A lock still in the document is taken as live until then (by the sweep, the stream
    /// or a scan alike): a swap committed just before expiry may be delivered late by the
    /// stream, and a service whose clock lags the monitor's may still swap under the lease.
    #[arg(long = "monitor-lapse-grace", env = "LOCKPROBE_MONITOR_LAPSE_GRACE", default_value = "30s", value_parser = crate::duration::parse_bounded_duration)]
    pub lapse_grace: Duration,
    /// The orchestrator's buffer after the convergence delay before hardDelete.
    ///
    /// hardDelete must not come before acquiredAt + declared delay + buffer.
    #[arg(long = "monitor-escalation-buffer", env = "LOCKPROBE_MONITOR_ESCALATION_BUFFER", default_value = "10m", value_parser = crate::duration::parse_bounded_duration)]
    pub escalation_buffer: Duration,
    /// The service's declared convergence delay (max cache TTL + replication bound); a
    /// lock declaring less is judged against this.
    ///
    /// A client that under-declares (effectiveAt - acquiredAt shorter than this) cannot
    /// hide an early escalation.
    #[arg(long = "monitor-declared-delay", env = "LOCKPROBE_MONITOR_DECLARED_DELAY", value_parser = crate::duration::parse_bounded_duration)]
    pub declared_delay: Option<Duration>,
    /// How many recent anomalies the status API lists (not a flag: embedders set it).
    #[arg(skip = MonitorConfig::RECENT_ANOMALIES)]
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
            recent_anomalies: Self::RECENT_ANOMALIES,
        }
    }
}

impl MonitorConfigError {
    /// The field at fault, e.g. `scan_interval`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::NotPositive { field } | Self::ZeroCount { field } | Self::TooLarge { field, .. } => field,
        }
    }

    /// The flag of the field at fault, e.g. `--monitor-scan-interval`.
    pub fn flag(&self) -> String {
        format!("--monitor-{}", self.field().replace('_', "-"))
    }

    /// The `[monitor]` key of the field at fault, e.g. `monitor_scan_interval`.
    pub fn key(&self) -> String {
        format!("monitor_{}", self.field())
    }

    /// What is wrong, without the name.
    pub fn reason(&self) -> String {
        match self {
            Self::NotPositive { .. } => "must be positive".into(),
            Self::ZeroCount { .. } => "must be at least 1".into(),
            Self::TooLarge { max, .. } => format!("must be at most {max}"),
        }
    }
}

impl MonitorConfig {
    /// Recent anomalies the status API lists by default.
    pub const RECENT_ANOMALIES: usize = 32;

    /// The most changes or documents asked of the store in one call (`poll_batch`,
    /// `scan_page`): every one is held in memory at once, and a store answers far fewer
    /// per page anyway (Cosmos DB: a few MB).
    pub const MAX_PAGE: usize = 100_000;

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
        for (field, n) in [("poll_batch", self.poll_batch), ("scan_page", self.scan_page)] {
            if n == 0 {
                return Err(MonitorConfigError::ZeroCount { field });
            }
            if n > Self::MAX_PAGE {
                return Err(MonitorConfigError::TooLarge { field, max: Self::MAX_PAGE });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        monitor: MonitorConfig,
    }

    fn parse(args: &[&str]) -> Result<MonitorConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("lockprobe").chain(args.iter().copied())).map(|c| c.monitor)
    }

    #[test]
    fn the_flags_default_to_the_defaults() {
        // A variable of this test's would race other tests; none of these is set here.
        assert_eq!(parse(&[]).unwrap(), MonitorConfig::default());
    }

    #[test]
    fn flags_parse_human_durations() {
        let from_flags = parse(&[
            "--monitor-scan-interval",
            "2s",
            "--monitor-escalation-buffer",
            "1s",
            "--monitor-declared-delay",
            "4s",
        ])
        .unwrap();
        assert_eq!(from_flags.scan_interval, Duration::from_secs(2));
        assert_eq!(from_flags.escalation_buffer, Duration::from_secs(1));
        assert_eq!(from_flags.declared_delay, Some(Duration::from_secs(4)));
        assert_eq!(from_flags.poll_interval, Duration::from_millis(200));
    }

    #[test]
    fn a_zero_interval_names_its_flag_and_its_key() {
        let err = parse(&["--monitor-sweep-interval", "0s"]).unwrap().validate().unwrap_err();
        assert_eq!(
            (err.flag(), err.key(), err.reason()),
            ("--monitor-sweep-interval".into(), "monitor_sweep_interval".into(), "must be positive".into())
        );
        assert!(parse(&["--monitor-poll-interval", "soon"]).is_err());
    }

    #[test]
    fn a_page_is_between_one_and_the_maximum() {
        for flag in ["--monitor-poll-batch", "--monitor-scan-page"] {
            let max = MonitorConfig::MAX_PAGE.to_string();
            parse(&[flag, "1"]).unwrap().validate().unwrap();
            parse(&[flag, &max]).unwrap().validate().unwrap();
            let over = (MonitorConfig::MAX_PAGE + 1).to_string();
            let err = parse(&[flag, &over]).unwrap().validate().unwrap_err();
            assert_eq!((err.flag(), err.reason()), (flag.to_owned(), format!("must be at most {max}")));
            assert!(parse(&[flag, "4000000000000000000000"]).is_err(), "{flag}: beyond usize, refused by the parser");
        }
    }

    #[test]
    fn an_interval_over_ten_years_names_its_flag() {
        let err = parse(&["--monitor-lapse-grace", "500000years"]).unwrap_err().to_string();
        assert!(err.contains("--monitor-lapse-grace") && err.contains("over the limit of 10years"), "{err}");
        assert!(parse(&["--monitor-lapse-grace", "10years"]).is_ok());
    }

    #[test]
    fn defaults_are_valid_and_zero_intervals_are_named() {
        MonitorConfig::default().validate().unwrap();
        let bad = MonitorConfig { scan_interval: Duration::ZERO, ..MonitorConfig::default() };
        assert_eq!(bad.validate(), Err(MonitorConfigError::NotPositive { field: "scan_interval" }));
        let bad = MonitorConfig { poll_batch: 0, ..MonitorConfig::default() };
        assert_eq!(bad.validate().unwrap_err().to_string(), "poll_batch must be at least 1");
    }
}
