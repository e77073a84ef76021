//! The probe's own HTTP server: `/metrics` (Prometheus text), `/healthz`, `/readyz`,
//! `/api/v1/status` (JSON, shape agreed with the status page), `/` (the status page) and,
//! when the process can reload its configuration, `POST /-/reload` (Prometheus's path).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::reload::{Reload, ReloadError, TYPE_PREFIX};
use crate::exposition;
use crate::listener::{self, Guards, Limits};
use crate::probe::outputs::metrics::Metrics;
use crate::probe::outputs::status::{ProbeStatus, StatusDocument};

/// What the handlers read.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The probe's metrics.
    pub metrics: Arc<Metrics>,
    /// The probe's status (cycles, readiness).
    pub status: Arc<ProbeStatus>,
    /// Re-reads the configuration, when the process has one to re-read.
    pub reload: Option<Arc<dyn Reload>>,
}

/// The router, separate from binding so tests can drive it with `oneshot`.
pub fn router(state: AppState) -> Router {
    let router = Router::new()
        .route("/", get(page))
        .route(exposition::PATH, exposition::route(state.metrics.registry().clone()))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/status", get(status));
    let router = if state.reload.is_some() { router.route("/-/reload", post(reload)) } else { router };
    router.with_state(state)
}

/// Serves `router(state)`, plus `extra` routes when given (e.g. the monitor's
/// `/api/v1/monitor` in `serve` and `demo`), on `listener` within `limits`, behind
/// `guards`, until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    extra: Option<Router>,
    limits: Limits,
    guards: Guards,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = match extra {
        Some(extra) => router(state).merge(extra),
        None => router(state),
    };
    listener::serve(listener, guards, app, limits, shutdown).await
}

async fn readyz(State(s): State<AppState>) -> Response {
    match s.status.not_ready_because() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

/// `POST /-/reload`: 200 with what changed, or the refusal as problem+json (the
/// configuration in force is kept).
async fn reload(State(s): State<AppState>) -> Response {
    let Some(reload) = s.reload else {
        return problem(&ReloadError::ShuttingDown);
    };
    match reload.reload().await {
        Ok(report) => Json(report).into_response(),
        Err(e) => problem(&e),
    }
}

/// A refused reload as RFC 9457 problem+json, with the field it is about.
fn problem(e: &ReloadError) -> Response {
    let mut body = serde_json::json!({
        "type": format!("{TYPE_PREFIX}{}", e.kind()),
        "title": "configuration not reloaded",
        "status": e.status().as_u16(),
        "detail": e.to_string(),
    });
    if let Some(field) = e.field() {
        body["field"] = field.into();
    }
    let mut response = (e.status(), body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

async fn status(State(s): State<AppState>) -> Json<StatusDocument> {
    Json(s.status.document(&s.metrics))
}

async fn page(State(s): State<AppState>) -> Html<String> {
    Html(crate::probe::outputs::status_page::render(&s.status.document(&s.metrics)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{header, Request};
    use tower::ServiceExt;

    fn state() -> AppState {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.register_target("demo", Some(1.5));
        let status = Arc::new(ProbeStatus::new());
        status.add_target("demo", &["http://127.0.0.1:1".into()], Some(1.5));
        AppState { metrics, status, reload: None }
    }

    async fn get(app: Router, path: &str) -> (StatusCode, String, String) {
        let r = app.oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = r.status();
        let ct = r.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, ct, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_follows_config_and_scheduler() {
        let s = state();
        assert_eq!(get(router(s.clone()), "/healthz").await.0, StatusCode::OK);
        assert_eq!(get(router(s.clone()), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        s.status.set_config_loaded(true);
        assert_eq!(get(router(s.clone()), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        s.status.set_scheduler_running(true);
        assert_eq!(get(router(s), "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_status_and_page() {
        let s = state();
        let (code, ct, body) = get(router(s.clone()), "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("text/plain"), "{ct}");
        assert!(body.contains(r#"lockprobe_probe_runs_total{result="passed",target="demo"} 0"#), "{body}");
        let (code, ct, body) = get(router(s.clone()), "/api/v1/status").await;
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("application/json"), "{ct}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["targets"][0]["name"], "demo");
        let (code, ct, body) = get(router(s), "/").await;
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("text/html"), "{ct}");
        assert!(body.contains("demo"), "{body}");
    }
}
