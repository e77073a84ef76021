//! The `lockprobe` command: parses the command line, starts tracing and hands the command
//! to its wiring in `lockprobe::app`, with a token that SIGINT or SIGTERM cancels. Logic
//! lives in the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use lockprobe::app::usage::{exit_code, EXIT_USAGE};
use lockprobe::app::{admin, bench, demo, gate, listen, monitor, serve, service, validate};

#[derive(Debug, Parser)]
#[command(
    name = "lockprobe",
    version = lockprobe::versions::VERSION_LINE.as_str(),
    about = "Synthetic probes and convergence monitoring for routing-embedded migration locks"
)]
struct Cli {
    /// Log lines on stderr: `text` for people, `json` (one object per line, with the
    /// span fields) for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reference resource-owning service (key in LOCKPROBE_LOCK_API_KEY).
    Service(Box<service::ServiceArgs>),
    /// The embedded default: store, service and probe in one process.
    Demo(Box<demo::DemoArgs>),
    /// One full probe cycle plus every negative check against a service (key in LOCKPROBE_LOCK_API_KEY).
    Validate(Box<validate::ValidateArgs>),
    /// The release gate: run a candidate service under every store-fault profile, probe
    /// each with the eager checks, write one JUnit report; exit 1 on any failure.
    Gate(Box<gate::GateArgs>),
    /// Run every configured target on its schedule, with metrics and status over HTTP.
    Serve(serve::ServeArgs),
    /// Watch every migration in a routing store: lock timelines, early escalations,
    /// orphaned locks, partial cutovers.
    Monitor(Box<monitor::MonitorCommand>),
    /// Measure the embedded lock design against the lock-record baseline: store reads
    /// per user operation, latency and throughput, at several fractions migrating.
    Bench(Box<bench::BenchArgs>),
    /// An operator's actions on a service's admin routes: `force-release request`,
    /// `approve` (a second principal) and `list`.
    Admin(Box<admin::AdminCommand>),
    /// Check a probe configuration file and/or a web configuration file, as `serve`
    /// and `monitor` load them; exit 64 naming the bad field.
    #[command(arg_required_else_help = true)]
    CheckConfig {
        /// The TOML configuration file.
        file: Option<std::path::PathBuf>,
        /// A web configuration file (TLS and basic authentication of the endpoints).
        #[arg(long = "web.config.file", value_name = "FILE")]
        web_config_file: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    // validate and demo print their own progress on stdout; info logs would interleave.
    let default_filter = match cli.command {
        Command::Validate(_) | Command::Demo(_) | Command::Gate(_) | Command::Bench(_) | Command::Admin(_) => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockprobe: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        // The long-running commands without a config file must not die of a SIGHUP (a
        // `systemctl reload`, a supervisor passing on a hangup): there is nothing to
        // re-read, so say so and keep serving. `serve` reloads on it instead.
        match &cli.command {
            Command::Service(_) => ignore_hangups("service"),
            Command::Monitor(_) => ignore_hangups("monitor"),
            _ => {}
        }
        match cli.command {
            Command::Service(args) => service::run(*args, shutdown).await.map(|()| 0),
            Command::Demo(args) => demo::run(*args, shutdown).await,
            Command::Validate(args) => validate::run(*args, shutdown).await,
            Command::Gate(args) => gate::run(*args, shutdown).await,
            Command::Bench(args) => bench::run(*args, shutdown).await,
            Command::Admin(command) => admin::run(*command, shutdown).await,
            Command::Serve(args) => serve::run(args, shutdown).await.map(|()| 0),
            Command::Monitor(cmd) => monitor::run(*cmd, shutdown).await.map(|()| 0),
            Command::CheckConfig { file, web_config_file } => {
                if let Some(file) = &file {
                    serve::check_config(file)?;
                }
                if let Some(web) = &web_config_file {
                    listen::check_web_config(web)?;
                }
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("lockprobe: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Catches SIGHUP for the rest of the process's life and logs that `command` has nothing
/// to reload, instead of the default action (exit 129).
fn ignore_hangups(command: &'static str) {
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hangups) => {
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    tracing::warn!(
                        "SIGHUP ignored: `lockprobe {command}` takes its settings from flags and has nothing to reload; restart it to change them"
                    );
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot catch SIGHUP; a SIGHUP will end the process"),
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// Cancels `token` on SIGINT or SIGTERM.
async fn cancel_on_signal(token: CancellationToken) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down");
    token.cancel();
}
