//! The contract's OpenAPI 3.1 description, served at `GET /openapi.json`.
//!
//! A JSON file maintained by hand beside the handlers rather than generated from them:
//! the handlers build their answers with `json!` and share extractors that turn every
//! rejection into problem+json, so a generator would describe little of what goes on
//! the wire without rewriting them around its annotations. The test below holds the file
//! to the router (every path and method, nothing more), and `tests/contract_fuzz.rs`
//! holds it to the answers (schemathesis generates requests from it and checks every
//! response against it).

use axum::http::header;
use axum::response::IntoResponse;

/// The description, as served.
pub const DOCUMENT: &str = include_str!("openapi.json");

/// `GET /openapi.json`.
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::service::{instance, items::ItemStores, paths, router, ServiceConfig};
    use crate::store::memory::{MemoryStore, MemoryStoreConfig};

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("openapi.json is JSON")
    }

    fn app() -> axum::Router {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
        let config = Arc::new(ServiceConfig::new("k"));
        router(instance(0, config, store, clock, Arc::new(ItemStores::default())).unwrap())
    }

    /// A concrete path for a template (`{id}`, `{key}` filled in).
    fn concrete(template: &str) -> String {
        template.replace("{id}", "probe-openapi").replace("{key}", "k")
    }

    #[test]
    fn describes_exactly_the_routers_paths() {
        let described: BTreeSet<String> = document()["paths"].as_object().unwrap().keys().cloned().collect();
        let served: BTreeSet<String> = paths::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(described, served);
        assert_eq!(document()["openapi"], "3.1.0");
    }

    #[tokio::test]
    async fn describes_exactly_the_methods_each_path_takes() {
        let doc = document();
        for path in paths::ALL {
            let item = &doc["paths"][path];
            for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
                let described = item.get(method.as_str().to_lowercase()).is_some();
                let request =
                    Request::builder().method(method.clone()).uri(concrete(path)).body(Body::empty()).unwrap();
                let answer = app().oneshot(request).await.unwrap();
                let taken = answer.status() != StatusCode::METHOD_NOT_ALLOWED;
                assert_eq!(described, taken, "{method} {path}: described {described}, router takes it {taken}");
            }
        }
    }

    #[tokio::test]
    async fn is_served_as_json() {
        let request = Request::get(paths::OPENAPI).body(Body::empty()).unwrap();
        let answer = app().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX).await.unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), document());
    }

    /// Every `$ref` points at something, and every stable problem type the service can
    /// answer with is described somewhere.
    #[test]
    fn references_resolve_and_every_problem_type_is_described() {
        let doc = document();
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("external ref {r}"));
            assert!(doc.pointer(pointer).is_some(), "dangling {r}");
        }
        let text = DOCUMENT;
        for kind in [
            "bad-request",
            "unauthorized",
            "forbidden",
            "not-test-resource",
            "not-found",
            "token-mismatch",
            "invalid-transition",
            "lock-expired",
            "payload-too-large",
            "idempotency-key-reused",
            "idempotency-records-full",
            "lock-held",
            "internal",
            "unsupported-document",
            "invalid-document",
            "store-unavailable",
            "conflict-retry-exhausted",
            "outcome-unknown",
            "admin-out-of-scope",
            "self-approval",
            "force-release-not-found",
            "force-release-target-changed",
            "force-release-void",
            "force-release-decided",
            "lock-force-released",
            "force-release-expired",
            "force-release-requests-full",
        ] {
            assert!(text.contains(&format!("\"urn:lockprobe:error:{kind}\"")), "{kind} is not described");
        }
    }

    fn collect_refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r.clone());
                }
                map.values().for_each(|v| collect_refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
