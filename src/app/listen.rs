//! `--header-read-timeout` and `--max-connections`: the listener bounds of every command
//! that listens (`service`, `serve`, `monitor`), one set of flags turned into
//! [`Limits`].

use std::time::Duration;

use crate::app::usage::UsageError;
use crate::listener::Limits;

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
