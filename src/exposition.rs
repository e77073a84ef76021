//! Prometheus text exposition: the one way a registry is rendered, and the one
//! `GET /metrics` route (the probe's server, `lockprobe monitor` and the reference
//! service all mount it).

use axum::http::header;
use axum::routing::{get, MethodRouter};
use prometheus::{Encoder, Registry, TextEncoder};

/// Where the metrics are served.
pub const PATH: &str = "/metrics";

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric of `registry` in the text exposition format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec only fails on invalid metric families, which registration
    // rules out.
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// `GET` handler serving `registry` (mount it at [`PATH`]).
pub fn route<S: Clone + Send + Sync + 'static>(registry: Registry) -> MethodRouter<S> {
    get(move || {
        let text = render(&registry);
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], text) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn serves_the_registry_as_text() {
        let registry = Registry::new();
        let c = prometheus::IntCounter::new("lockprobe_test_total", "A test counter.").unwrap();
        registry.register(Box::new(c.clone())).unwrap();
        c.inc();
        let app = axum::Router::new().route(PATH, route(registry));
        let r = app.oneshot(Request::get(PATH).body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("lockprobe_test_total 1"));
    }
}
