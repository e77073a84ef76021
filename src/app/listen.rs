//! `--header-read-timeout` and `--max-connections`: the listener bounds of every command
//! that listens (`service`, `serve`, `monitor`), one set of flags turned into
//! [`Limits`]; `--web.config.file`, the TLS and basic authentication of `serve`'s and
//! `monitor`'s endpoints, turned into [`Guards`] that follow the file.

use std::path::PathBuf;
use std::time::Duration;

use prometheus::{Gauge, Opts, Registry};
use tokio_util::sync::CancellationToken;

use crate::app::usage::UsageError;
use crate::listener::web_config::WebConfigWatch;
use crate::listener::{Guards, Limits};

/// `--web.config.file`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct WebArgs {
    /// TLS and basic authentication for this process's endpoints, in the Prometheus
    /// exporter toolkit's web configuration format (tls_server_config,
    /// http_server_config, basic_auth_users); re-read within a second when it or a file
    /// it names changes. Without it, plain HTTP and no authentication.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
}

/// `lockprobe check-config --web.config.file FILE`: loads it as `serve` and `monitor`
/// do (the files it names included) and says what it turns on.
pub fn check_web_config(path: &std::path::Path) -> Result<(), UsageError> {
    let loaded =
        crate::listener::web_config::load(path).map_err(|e| UsageError::new(format!("--web.config.file {e}")))?;
    println!("{}: ok (web configuration: {})", path.display(), loaded.summary());
    Ok(())
}

impl WebArgs {
    /// The endpoints' guards: open without a file; else the file's, followed until
    /// `shutdown`, with `lockprobe_web_config_last_reload_successful` and
    /// `lockprobe_web_config_last_reload_success_timestamp_seconds` in `registry`. A
    /// file that does not load refuses the start, naming the flag and the field.
    pub fn guards(&self, registry: &Registry, shutdown: CancellationToken) -> anyhow::Result<Guards> {
        let Some(path) = &self.web_config_file else { return Ok(Guards::open()) };
        let (watch, loaded) = WebConfigWatch::start(path, shutdown.clone())
            .map_err(|e| UsageError::new(format!("--web.config.file {e}")))?;
        tracing::info!(file = %path.display(), in_force = %loaded.summary(), "web configuration loaded");
        let successful = Gauge::with_opts(Opts::new(
            "lockprobe_web_config_last_reload_successful",
            "1 if the last change to --web.config.file (or a file it names) loaded; 0 while the previous configuration is kept",
        ))?;
        let loaded_at = Gauge::with_opts(Opts::new(
            "lockprobe_web_config_last_reload_success_timestamp_seconds",
            "When the web configuration in force was loaded (Unix seconds)",
        ))?;
        registry.register(Box::new(successful.clone()))?;
        registry.register(Box::new(loaded_at.clone()))?;
        let mut outcomes = watch.outcomes();
        let show = move |o: crate::listener::web_config::ReloadOutcome| {
            successful.set(if o.successful { 1.0 } else { 0.0 });
            loaded_at.set(o.loaded_at);
        };
        show(*outcomes.borrow_and_update());
        let guards = watch.guards();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    changed = outcomes.changed() => match changed {
                        Ok(()) => show(*outcomes.borrow_and_update()),
                        Err(_) => return,
                    },
                }
            }
        });
        Ok(guards)
    }
}

/// The listener's bounds as flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct ListenArgs {
    /// How long a client may take to send a request's head (request line and headers),
    /// from the connection's start or the end of its previous response; a connection
    /// idle for as long is closed, and a TLS handshake gets as long again.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "10s")]
    pub header_read_timeout: Duration,
    /// Connections served at once; at the cap the server stops accepting until one
    /// closes. Lowered to the file-descriptor limit (ulimit -n) less 256.
    #[arg(long, default_value_t = 16_384)]
    pub max_connections: usize,
}

impl ListenArgs {
    /// The limits these flags describe; a bad one is a usage error naming its flag.
    pub fn limits(&self) -> Result<Limits, UsageError> {
        let limits = Limits {
            header_read_timeout: self.header_read_timeout,
            max_connections: self.max_connections,
            ..Limits::default()
        };
        limits.validate().map_err(|e| UsageError::new(format!("--{} {}", e.field.replace('_', "-"), e.reason)))?;
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        listen: ListenArgs,
    }

    #[test]
    fn defaults_are_the_libraries_and_a_refusal_names_the_flag() {
        let cli = Cli::parse_from(["x"]);
        assert_eq!(cli.listen.limits().unwrap(), Limits::default());
        let err = Cli::parse_from(["x", "--max-connections", "0"]).listen.limits().unwrap_err();
        assert!(err.0.starts_with("--max-connections must be at least 1"), "{err}");
    }
}
