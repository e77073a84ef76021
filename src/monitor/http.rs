//! The monitor's status route and page, for the lead's server to mount
//! (`/api/v1/monitor` and `/monitor`), and
//! the health routes `lockprobe monitor` serves when it runs alone (inside `serve` the
//! probe's server has its own `/healthz` and `/readyz`).

use std::sync::Arc;

use super::{Monitor, MonitorStatus};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Html;
use axum::routing::get;
use axum::{Json, Router};

/// Where the status document is served.
pub const STATUS_PATH: &str = "/api/v1/monitor";

pub use super::page::PAGE_PATH;

/// `GET /api/v1/monitor`: [`Monitor::status`] as JSON; `GET /monitor`: the same as a page.
pub fn router(monitor: Arc<Monitor>) -> Router {
    Router::new().route(STATUS_PATH, get(status)).route(PAGE_PATH, get(page)).with_state(monitor)
}

async fn status(State(monitor): State<Arc<Monitor>>) -> Json<MonitorStatus> {
    Json(monitor.status())
}

async fn page(State(monitor): State<Arc<Monitor>>) -> Html<String> {
    Html(super::page::render(&monitor.status()))
}

/// `GET /healthz`: 200 while the process runs. `GET /readyz`: 200 once the monitor has
/// completed a full scan of the store (it has read what it watches, so its gauges mean
/// something), 503 before, and while the store cannot be read at start.
pub fn health_router(monitor: Arc<Monitor>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(readyz)).with_state(monitor)
}

async fn readyz(State(monitor): State<Arc<Monitor>>) -> (StatusCode, &'static str) {
    if monitor.has_scanned() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: no full scan of the store yet\n")
    }
}
