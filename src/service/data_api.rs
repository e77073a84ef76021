//! The routing path as users meet it: the route view and the item API.
//!
//! Each call resolves the location document through this instance's cache, asks
//! `enforce` what the resolved lock allows, and acts on the item store of the resolved
//! location, all while the route is lent (`Instance::route_with`): a cache hit takes no
//! reference on the cached document. Every answer carries `Server-Timing: route;desc=<source>;dur=<ms>`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::design::Routed;
use super::error::ApiError;
use super::input::{self, JsonBody, PathParams};
use super::items::WriteOutcome;
use super::{Fault, Instance};
use crate::routing::{enforce, Decision, Operation, RoutingError, Source};

/// Body of an item write.
#[derive(Debug, Deserialize)]
pub struct WriteBody {
    value: Value,
}

/// Adds `Server-Timing` describing how the route was resolved and, for a store with
/// regions, `store;desc="<region>"`: the region lock decisions read now, so a client sees
/// a failover.
fn timed(instance: &Instance, routed: Option<&Routed<'_>>, response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    let (source, store_time) = routed.map_or((Source::Store, Duration::ZERO), |r| (r.source, r.store_time));
    let mut value = format!("route;desc=\"{}\";dur={:.3}", source.as_str(), store_time.as_secs_f64() * 1000.0);
    // The lock-record design's read of the lock record, every operation.
    if let Some(lock_time) = routed.and_then(|r| r.lock_time) {
        value.push_str(&format!(", lock;desc=\"record\";dur={:.3}", lock_time.as_secs_f64() * 1000.0));
    }
    if let Some(region) = instance.routing.store_region() {
        let region: String = region.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        value.push_str(&format!(", store;desc=\"{region}\""));
    }
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert("server-timing", v);
    }
    response
}

/// A resolve failure, still timed (a miss that found nothing was a store read).
fn unresolved(instance: &Instance, e: RoutingError) -> Response {
    timed(instance, None, ApiError::from(e))
}

/// The decision for `op`, bent by deliberately injected faults.
fn decide(instance: &Instance, op: Operation, resolved: &Routed<'_>) -> Decision {
    let policy = instance.routing.policy();
    let decision = enforce(op, resolved.lock(), instance.routing.clock().now(), policy.skew_margin);
    match decision {
        Decision::Block { .. } if instance.config.has_fault(Fault::IgnoreWriteLock) => Decision::Allow,
        Decision::Tombstone if instance.config.has_fault(Fault::IgnoreHardDeleteLock) => Decision::Allow,
        other => other,
    }
}

fn blocked(instance: &Instance, retry_after: Duration) -> ApiError {
    ApiError::locked("a write lock is in force; retry shortly", retry_after.min(instance.config.max_retry_after))
}

/// `GET /v1/resources/{id}/route`.
pub async fn route(State(instance): State<Arc<Instance>>, PathParams(id): PathParams<String>) -> Response {
    if let Err(e) = instance.check_resource_id(&id) {
        return e.into_response();
    }
    let answered = instance.route_with(&id, false, |resolved| {
        let now = instance.routing.clock().now();
        let lock = resolved.live_lock(now).map(
            |l| json!({ "phase": l.phase, "effectiveAt": l.effective_at, "expiresAt": l.expires_at, "owner": l.owner }),
        );
        let body = json!({ "location": resolved.location(), "lock": lock, "source": resolved.source.as_str() });
        timed(&instance, Some(resolved), Json(body))
    });
    answered.await.unwrap_or_else(|e| unresolved(&instance, e))
}

/// `GET /v1/resources/{id}/items/{key}`: reads are never blocked.
pub async fn read_item(
    State(instance): State<Arc<Instance>>,
    PathParams((id, key)): PathParams<(String, String)>,
) -> Response {
    if let Err(e) = instance.check_resource_id(&id).and_then(|_| input::check_name("item key", &key)) {
        return e.into_response();
    }
    let answered = instance.route_with(&id, false, |resolved| {
        debug_assert_eq!(decide(&instance, Operation::Read, resolved), Decision::Allow);
        let answer = match instance.items.get(resolved.location(), &id, &key) {
            Some(item) => Json(json!({ "key": key, "value": item.value, "tombstone": item.tombstone })).into_response(),
            None => ApiError::not_found(format!("no item {key:?}")).into_response(),
        };
        timed(&instance, Some(resolved), answer)
    });
    answered.await.unwrap_or_else(|e| unresolved(&instance, e))
}

/// `PUT /v1/resources/{id}/items/{key}`: 423 while a write lock is in force.
pub async fn write_item(
    State(instance): State<Arc<Instance>>,
    PathParams((id, key)): PathParams<(String, String)>,
    body: Result<JsonBody<WriteBody>, ApiError>,
) -> Response {
    let checked = instance.check_resource_id(&id).and_then(|_| input::check_name("item key", &key));
    let JsonBody(body) = match checked.and(body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let answered = instance.route_with(&id, true, |resolved| {
        let answer = match decide(&instance, Operation::Write, resolved) {
            Decision::Block { retry_after } => blocked(&instance, retry_after).into_response(),
            Decision::Allow | Decision::Tombstone => {
                let status = match instance.items.put(resolved.location(), &id, &key, body.value.clone()) {
                    WriteOutcome::Created => StatusCode::CREATED,
                    WriteOutcome::Replaced => StatusCode::OK,
                };
                (status, Json(json!({ "key": key, "value": body.value, "tombstone": false }))).into_response()
            }
        };
        timed(&instance, Some(resolved), answer)
    });
    answered.await.unwrap_or_else(|e| unresolved(&instance, e))
}

/// `DELETE /v1/resources/{id}/items/{key}`: 204 deleted, 202 tombstoned, 423 blocked.
pub async fn delete_item(
    State(instance): State<Arc<Instance>>,
    PathParams((id, key)): PathParams<(String, String)>,
) -> Response {
    if let Err(e) = instance.check_resource_id(&id).and_then(|_| input::check_name("item key", &key)) {
        return e.into_response();
    }
    let answered = instance.route_with(&id, false, |resolved| {
        let location = resolved.location();
        let missing = || ApiError::not_found(format!("no item {key:?}")).into_response();
        let answer = match decide(&instance, Operation::Delete, resolved) {
            Decision::Block { retry_after } => blocked(&instance, retry_after).into_response(),
            Decision::Tombstone if instance.items.tombstone(location, &id, &key) => {
                (StatusCode::ACCEPTED, Json(json!({ "tombstone": true }))).into_response()
            }
            Decision::Allow if instance.items.remove(location, &id, &key) => StatusCode::NO_CONTENT.into_response(),
            Decision::Tombstone | Decision::Allow => missing(),
        };
        timed(&instance, Some(resolved), answer)
    });
    answered.await.unwrap_or_else(|e| unresolved(&instance, e))
}
