//! `lockprobe monitor`: the monitor alone, serving its status and metrics.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::monitor::args::MonitorArgs;
use crate::monitor::{http, Monitor, MonitorConfig};
use crate::clock::{Clock, SystemClock};
use crate::exposition;
use super::store::{OpenStoreError, StoreArgs};
use crate::usage::UsageError;

/// `lockprobe monitor` flags: which store, the monitor's own, and where to serve.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorCommand {
    /// The store to watch (`--store memory|cosmos` and the `--cosmos-*` flags).
    #[command(flatten)]
    pub store: StoreArgs,
    /// Monitor settings.
    #[command(flatten)]
    pub monitor: MonitorArgs,
    /// Address serving `/metrics` and `/api/v1/monitor` (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:9108")]
    pub listen: SocketAddr,
}

/// Runs the monitor and its HTTP endpoints on `--listen` until `shutdown`.
pub async fn run(cmd: MonitorCommand, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Bad flags are usage errors, reported before the port is taken.
    let config = cmd.monitor.to_config().map_err(|e| UsageError::new(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(cmd.listen).await.with_context(|| format!("binding --listen {}", cmd.listen))?;
    serve(cmd.store, config, listener, shutdown).await
}

/// Like [`run`], on a listener the caller bound (`--listen` is ignored), so a test
/// can bind port 0 and know the port without giving it back first.
pub async fn run_on(cmd: MonitorCommand, listener: tokio::net::TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = cmd.monitor.to_config().map_err(|e| UsageError::new(e.to_string()))?;
    serve(cmd.store, config, listener, shutdown).await
}

async fn serve(store: StoreArgs, config: MonitorConfig, listener: tokio::net::TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let registry = Registry::new();
    // `memory` watches an empty in-process store: a smoke test on its own; `serve` and
    // `demo` hand the monitor the store they run on.
    let store = store.open(clock.clone(), std::time::Duration::ZERO, &registry).await.map_err(OpenStoreError::into_anyhow)?;
    let monitor = Arc::new(Monitor::new(store, clock, config, &registry)?);
    let app = http::router(monitor.clone()).route(exposition::PATH, exposition::route(registry));
    println!("lockprobe monitor: listening on http://{}", listener.local_addr()?);
    let serve = axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let (_, served) = tokio::join!(monitor.run(shutdown.clone()), serve);
    served.context("serving the monitor's endpoints")
}
