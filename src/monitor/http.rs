//! The monitor's status route, for the lead's server to mount (`/api/v1/monitor`).

use std::sync::Arc;

use super::{Monitor, MonitorStatus};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

/// Where the status document is served.
pub const STATUS_PATH: &str = "/api/v1/monitor";

/// `GET /api/v1/monitor`: [`Monitor::status`] as JSON.
pub fn router(monitor: Arc<Monitor>) -> Router {
    Router::new().route(STATUS_PATH, get(status)).with_state(monitor)
}

async fn status(State(monitor): State<Arc<Monitor>>) -> Json<MonitorStatus> {
    Json(monitor.status())
}
